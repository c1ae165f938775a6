"""`tfservo.sagemaker_sdk.Session`: the SageMaker SDK's local mode, with tfservo in place of Docker.

A subclass of the SDK's own `LocalSession` (so every `isinstance(..., LocalSession)` check in
the SDK holds) whose `sagemaker_client` is tfservo's control plane and whose
`sagemaker_runtime_client` is boto3's real `sagemaker-runtime` client pointed at the endpoint's
`tfservo serve`: predictions and errors (botocore's ModelError, ValidationError) are exactly
what client code sees against SageMaker.

The SDK insists on S3 for model archives it repacks with an `entry_point` and for
`MultiDataModel`; the session uses the S3 that boto3 is configured for (`s3_endpoint_url`,
`AWS_ENDPOINT_URL_S3`, or AWS), or with `local_s3=True` (the default when no endpoint and no
AWS credentials are found) an S3 API server of its own on loopback (moto), in memory; then
AWS_ENDPOINT_URL_S3 points at it until `close()`, since some SDK paths ignore the session's.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from typing import Any

import boto3
from botocore.config import Config

from tfservo.core import environment
from tfservo.core.extras import require

require("tfservo.sagemaker_sdk", "sagemaker", "sagemaker")
from sagemaker.exceptions import UnexpectedStatusException  # noqa: E402
from sagemaker.local.local_session import LocalSession  # noqa: E402

from tfservo.sagemaker_sdk.control_plane import ControlPlane  # noqa: E402

__all__ = ["Session"]

log = logging.getLogger("tfservo.sagemaker_sdk")

_DEFAULT_REGION = "us-east-1"

# Keys for a session that has none (local S3); a server checks signatures only with --sigv4-credentials.
_LOCAL_KEYS = {"aws_access_key_id": "tfservo", "aws_secret_access_key": "tfservo"}


def _with_region(session: boto3.session.Session, region: str) -> boto3.session.Session:
    """A session with the same credentials and a region (boto3 sets a region only when a session
    is made): keys given in code are carried over, anything else is found again the same way."""
    credentials = session.get_credentials()
    if credentials is not None and credentials.method == "explicit":
        keys = credentials.get_frozen_credentials()
        return boto3.Session(aws_access_key_id=keys.access_key, aws_secret_access_key=keys.secret_key,
                             aws_session_token=keys.token, region_name=region)
    profile = session.profile_name
    return boto3.Session(profile_name=None if profile == "default" else profile, region_name=region)


class Session(LocalSession):
    """Pass as `sagemaker_session=` (with `instance_type='local'`): endpoints and transform jobs
    run on this machine with tfservo; nothing needs Docker or an AWS account.

    `endpoint_url` reaches an endpoint this session did not start (`Predictor(name,
    sagemaker_session=...)` against a `tfservo serve` running elsewhere); endpoints it started
    are reached by name. Call `close()` (or leave the process) to stop what it started.
    """

    def __init__(
        self,
        boto_session: boto3.session.Session | None = None,
        default_bucket: str | None = None,
        s3_endpoint_url: str | None = None,
        *,
        endpoint_url: str | None = None,
        local_s3: bool | None = None,
        **kwargs: Any,
    ) -> None:
        self._moto: Any = None
        self.endpoint_url = endpoint_url or environment.variable("TFSERVO_ENDPOINT_URL") or None
        _warn_of_a_general_endpoint(self.endpoint_url)
        boto_session = boto_session or boto3.Session()
        if boto_session.region_name is None:
            boto_session = _with_region(boto_session, _DEFAULT_REGION)
        s3_endpoint_url = s3_endpoint_url or environment.variable("AWS_ENDPOINT_URL_S3") or environment.variable("AWS_ENDPOINT_URL")
        if local_s3 is None:
            local_s3 = s3_endpoint_url is None and boto_session.get_credentials() is None
        self._restore_env: dict[str, str | None] = {}
        if local_s3:
            s3_endpoint_url = self._start_local_s3()
            boto_session = boto3.Session(region_name=boto_session.region_name, **_LOCAL_KEYS)
            # Some SDK paths (repacking an entry_point) make S3 clients from the boto session
            # without the session's s3_endpoint_url; botocore's variable reaches those too.
            self._restore_env = environment.export({"AWS_ENDPOINT_URL_S3": s3_endpoint_url})
        self._child_env = _child_aws_env(boto_session, s3_endpoint_url)
        super().__init__(
            boto_session=boto_session,
            default_bucket=default_bucket or "sagemaker-tfservo",
            s3_endpoint_url=s3_endpoint_url,
            **kwargs,
        )
        # The SDK's public attributes for its two clients, replaced once LocalSession set its own.
        self.control_plane = ControlPlane(self.boto_region_name, self._child_env)
        self.sagemaker_client = self.control_plane
        self.sagemaker_runtime_client = RuntimeClient(self)
        atexit.register(self.close)

    def _start_local_s3(self) -> str:
        ThreadedMotoServer = require("local_s3 (or give s3_endpoint_url)", "sagemaker", "moto.server").ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        log.info("local S3 API on http://%s:%d (in memory, for this session)", host, port)
        return f"http://{host}:{port}"

    # -- what the SDK would ask AWS for -------------------------------------------------------

    def expand_role(self, role: str) -> str:
        """A role is only recorded: nothing here assumes it (no IAM call)."""
        return role

    def wait_for_endpoint(self, endpoint: str, poll: int = 30, live_logging: bool = False) -> dict[str, Any]:
        """Endpoints are up when created (the SDK's own wait sleeps `poll` seconds first)."""
        description = self.control_plane.describe_endpoint(endpoint)
        if description["EndpointStatus"] != "InService":
            raise UnexpectedStatusException(  # type: ignore[no-untyped-call, unused-ignore]
                message=(
                    f"Error hosting endpoint {endpoint}: {description['EndpointStatus']}. "
                    f"Reason: {description.get('FailureReason', '(No reason provided)')}"
                ),
                allowed_statuses=["InService"],
                actual_status=description["EndpointStatus"],
            )
        return description

    def logs_for_transform_job(self, job_name: str, wait: bool = False, poll: int = 10) -> None:
        """The job's progress lines (tfservo transform's log) until it ends; raises as the SDK
        does when it failed (UnexpectedStatusException with the reason)."""
        run = self.control_plane.transform_run(job_name)
        if wait:
            run.follow(lambda line: print(line, file=sys.stdout, flush=True))
        self.wait_for_transform_job(job_name, poll=1)

    def wait_for_transform_job(self, job: str, poll: int = 5) -> dict[str, Any]:
        run = self.control_plane.transform_run(job)
        run.follow(lambda line: None)
        description = self.control_plane.describe_transform_job(job)
        if description["TransformJobStatus"] not in ("Completed", "Stopped"):
            raise UnexpectedStatusException(  # type: ignore[no-untyped-call, unused-ignore]
                message=(
                    f"Error for Transform job {job}: {description['TransformJobStatus']}. "
                    f"Reason: {description.get('FailureReason', '(No reason provided)')}"
                ),
                allowed_statuses=["Completed", "Stopped"],
                actual_status=description["TransformJobStatus"],
            )
        return description

    def close(self) -> None:
        """Stop the endpoints and transform jobs this session started, and its local S3."""
        control_plane = getattr(self, "control_plane", None)
        if control_plane is not None:
            control_plane.close()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        environment.export(self._restore_env)
        self._restore_env = {}


def _warn_of_a_general_endpoint(endpoint_url: str | None) -> None:
    """AWS_ENDPOINT_URL redirects every service botocore calls, sagemaker-runtime too: clients
    made without this session (a Predictor of its own, a plain boto3 client) would send their
    calls there, not to tfservo. Say so once, and what to set instead."""
    general = environment.variable("AWS_ENDPOINT_URL")
    runtime = environment.variable("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME")
    if general and not runtime and general != endpoint_url:
        log.warning(
            "AWS_ENDPOINT_URL=%s also redirects sagemaker-runtime: a Predictor or boto3 client made without "
            "this session sends its calls there%s. Set AWS_ENDPOINT_URL_S3 for S3 alone, and "
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME to tfservo's URL", general,
            f", not to {endpoint_url}" if endpoint_url else "",
        )


class RuntimeClient:
    """`sagemaker_runtime_client`: boto3's own client, pointed at the endpoint's server."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.config: object = None  # LocalSession hands its local-mode config to its runtime client
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()

    def client(self, url: str) -> Any:
        with self._lock:
            if url not in self._clients:
                self._clients[url] = self.session.boto_session.client(
                    "sagemaker-runtime",
                    endpoint_url=url,
                    region_name=self.session.boto_region_name,
                    config=Config(retries={"max_attempts": 1}, read_timeout=3600),
                    # the session's own keys, so a server with --sigv4-credentials knows them
                    **({} if self.session.boto_session.get_credentials() is not None else _LOCAL_KEYS),
                )
            return self._clients[url]

    def invoke_endpoint(self, EndpointName: str, **kwargs: object) -> dict[str, Any]:  # boto3's shape
        answer: dict[str, Any] = self._serving(EndpointName, "InvokeEndpoint").invoke_endpoint(
            EndpointName=EndpointName, **kwargs)
        return answer

    def invoke_endpoint_async(self, EndpointName: str, **kwargs: object) -> dict[str, Any]:  # boto3's shape
        """The SDK's AsyncPredictor calls this: the request is queued by the endpoint's server."""
        client = self._serving(EndpointName, "InvokeEndpointAsync")
        answer: dict[str, Any] = client.invoke_endpoint_async(EndpointName=EndpointName, **kwargs)
        return answer

    def _serving(self, endpoint: str, operation: str) -> Any:
        """The client of the server that answers for `endpoint`."""
        url = self.session.control_plane.endpoint_url(endpoint) or self.session.endpoint_url
        if url is None:
            missing = self.client("http://127.0.0.1:1").exceptions.ValidationError
            raise missing(
                {"Error": {"Code": "ValidationError", "Message": (
                    f"Endpoint {endpoint} not found: this session did not start it; pass "
                    "endpoint_url='http://HOST:PORT' (or set TFSERVO_ENDPOINT_URL) to reach a tfservo serve"
                )}},
                operation,
            )
        return self.client(url)


def _child_aws_env(boto_session: boto3.session.Session, s3_endpoint_url: str | None) -> dict[str, str]:
    """What `tfservo serve`/`transform` need to read the session's S3."""
    env = {"AWS_DEFAULT_REGION": boto_session.region_name or _DEFAULT_REGION}
    credentials = boto_session.get_credentials()
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        env |= {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
        if frozen.token:
            env["AWS_SESSION_TOKEN"] = frozen.token
    if s3_endpoint_url:
        env["AWS_ENDPOINT_URL_S3"] = s3_endpoint_url
    return env

