"""The SageMaker API calls the SDK makes (models, endpoint configs, endpoints, transform jobs),
answered on this machine: an endpoint is a `tfservo serve`, a transform job a `tfservo transform`.

Method names and arguments are boto3's `sagemaker` client's, so the SDK's `Session` calls them
unchanged; answers carry the fields the SDK reads. Unknown names raise botocore's ClientError
with SageMaker's ValidationException, as the service does.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from tfservo.batch.job import api_values
from tfservo.sagemaker_sdk.processes import EndpointServer, TransformRun, child_env

__all__ = ["ControlPlane"]

log = logging.getLogger("tfservo.sagemaker_sdk")

_ARN = "arn:aws:sagemaker:{region}:000000000000:{kind}/{name}"


def _not_found(what: str, name: str, operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": "ValidationException", "Message": f"Could not find {what} \"{name}\"."}}, operation
    )


def _local(uri: str) -> str:
    """file:///x → /x (tfservo reads local paths and s3:// alike)."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _model_data(container: Mapping[str, Any]) -> str:
    if "ModelDataUrl" in container:
        return str(container["ModelDataUrl"])
    source = container.get("ModelDataSource", {}).get("S3DataSource", {})
    if "S3Uri" in source:
        return str(source["S3Uri"])
    raise ValueError("the model has no ModelDataUrl: tfservo serves a model.tar.gz or a model dir")


class ControlPlane:
    """What `sagemaker_client` answers in a tfservo session; holds the running processes."""

    def __init__(self, region: str, env: Mapping[str, str]) -> None:
        self.region = region
        self.env = dict(env)  # for every child: S3 endpoint and credentials
        self._models: dict[str, dict[str, object]] = {}
        self._configs: dict[str, dict[str, object]] = {}
        self._endpoints: dict[str, tuple[EndpointServer, dict[str, object]]] = {}
        self._jobs: dict[str, tuple[TransformRun, dict[str, object]]] = {}
        self._lock = threading.Lock()
        self._work = tempfile.mkdtemp(prefix="tfservo-control-plane-")  # files handed to the servers

    def _arn(self, kind: str, name: str) -> str:
        return _ARN.format(region=self.region, kind=kind, name=name.lower())

    # -- models and endpoint configs -------------------------------------------------------

    def create_model(self, ModelName: str, PrimaryContainer: dict[str, Any] | None = None,
                     Containers: list[dict[str, Any]] | None = None,
                     **kwargs: object) -> dict[str, object]:
        containers = [PrimaryContainer] if PrimaryContainer else list(Containers or [])
        if len(containers) != 1:
            raise ValueError(f"model {ModelName}: tfservo serves one container per model, got {len(containers)}")
        self._models[ModelName] = {
            "ModelName": ModelName, "PrimaryContainer": containers[0], "ModelArn": self._arn("model", ModelName),
            "ExecutionRoleArn": kwargs.get("ExecutionRoleArn"), "CreationTime": _now(),
        }
        return {"ModelArn": self._arn("model", ModelName)}

    def describe_model(self, ModelName: str) -> dict[str, Any]:
        if ModelName not in self._models:
            raise _not_found("model", ModelName, "DescribeModel")
        return dict(self._models[ModelName])

    def delete_model(self, ModelName: str) -> dict[str, object]:
        self._models.pop(ModelName, None)
        return {}

    def create_endpoint_config(self, EndpointConfigName: str, ProductionVariants: list[dict[str, Any]],
                               **kwargs: object) -> dict[str, object]:
        self._configs[EndpointConfigName] = {
            "EndpointConfigName": EndpointConfigName, "ProductionVariants": ProductionVariants,
            "EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName), "CreationTime": _now(),
            **{key: kwargs[key] for key in ("DataCaptureConfig", "AsyncInferenceConfig") if kwargs.get(key)},
        }
        return {"EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName)}

    def describe_endpoint_config(self, EndpointConfigName: str) -> dict[str, Any]:
        if EndpointConfigName not in self._configs:
            raise _not_found("endpoint configuration", EndpointConfigName, "DescribeEndpointConfig")
        return dict(self._configs[EndpointConfigName])

    def delete_endpoint_config(self, EndpointConfigName: str) -> dict[str, object]:
        self._configs.pop(EndpointConfigName, None)
        return {}

    # -- endpoints ---------------------------------------------------------------------------

    def create_endpoint(self, EndpointName: str, EndpointConfigName: str, **kwargs: object) -> dict[str, object]:
        """Start `tfservo serve` for the config's variant and return once it answers /ping."""
        config = self.describe_endpoint_config(EndpointConfigName)
        variants = config["ProductionVariants"]
        if len(variants) != 1:
            raise ValueError(f"endpoint {EndpointName}: tfservo runs one production variant, got {len(variants)}")
        variant = variants[0]
        model = self.describe_model(variant["ModelName"])
        container = model["PrimaryContainer"]
        source = _local(_model_data(container))
        args = ["--multi-model", "--model-root", source] if container.get("Mode") == "MultiModel" else [source]
        args += ["--variant-name", variant.get("VariantName", "AllTraffic")]
        if config.get("DataCaptureConfig"):  # captured as SageMaker would, under {destination}/{endpoint}/{variant}/
            capture = os.path.join(self._work, f"{EndpointName}-data-capture.json")
            with open(capture, "w") as f:
                json.dump(config["DataCaptureConfig"], f)
            args += ["--data-capture-config", capture]
        if config.get("AsyncInferenceConfig"):  # InvokeEndpointAsync, its queue kept beside the endpoint's log
            queued = os.path.join(self._work, f"{EndpointName}-async.json")
            with open(queued, "w") as f:
                json.dump(config["AsyncInferenceConfig"], f)
            args += ["--async-inference-config", queued, "--async-state", os.path.join(self._work, f"{EndpointName}-async")]
        if config.get("DataCaptureConfig") or config.get("AsyncInferenceConfig"):
            args += ["--endpoint-name", EndpointName]
        with self._lock:
            if EndpointName in self._endpoints and self._endpoints[EndpointName][0].url:
                raise ClientError(
                    {"Error": {"Code": "ValidationException",
                               "Message": f"Cannot create already existing endpoint \"{EndpointName}\"."}},
                    "CreateEndpoint",
                )
        server = EndpointServer(EndpointName, args, child_env({**self.env, **container.get("Environment", {})}))
        description = {
            "EndpointName": EndpointName, "EndpointArn": self._arn("endpoint", EndpointName),
            "EndpointConfigName": EndpointConfigName, "CreationTime": _now(),
            "ProductionVariants": [{"VariantName": variant.get("VariantName", "AllTraffic"),
                                    "CurrentInstanceCount": 1}],
        }
        with self._lock:
            self._endpoints[EndpointName] = (server, description)
        if server.start():
            log.info("endpoint %s serves %s on %s", EndpointName, source, server.url)
        else:
            log.error("endpoint %s failed: %s", EndpointName, server.failure)
        return {"EndpointArn": description["EndpointArn"]}

    def describe_endpoint(self, EndpointName: str) -> dict[str, object]:
        with self._lock:
            found = self._endpoints.get(EndpointName)
        if found is None:
            raise _not_found("endpoint", EndpointName, "DescribeEndpoint")
        server, description = found
        status = "InService" if server.url else "Failed"
        return {**description, "EndpointStatus": status,
                **({"FailureReason": server.failure} if server.failure else {})}

    def endpoint_url(self, name: str) -> str | None:
        """The URL of a running endpoint this session started, else None."""
        with self._lock:
            found = self._endpoints.get(name)
        return found[0].url or None if found else None

    def delete_endpoint(self, EndpointName: str) -> dict[str, object]:
        with self._lock:
            found = self._endpoints.pop(EndpointName, None)
        if found is None:
            raise _not_found("endpoint", EndpointName, "DeleteEndpoint")
        found[0].stop()
        log.info("endpoint %s stopped", EndpointName)
        return {}

    # -- transform jobs ------------------------------------------------------------------------

    def create_transform_job(
        self,
        TransformJobName: str,
        ModelName: str,
        TransformInput: dict[str, Any],
        TransformOutput: dict[str, Any],
        TransformResources: dict[str, Any],
        BatchStrategy: str | None = None,
        MaxConcurrentTransforms: int | None = None,
        MaxPayloadInMB: int | None = None,
        Environment: dict[str, str] | None = None,
        DataProcessing: dict[str, str] | None = None,
        **kwargs: object,
    ) -> dict[str, object]:
        """Start `tfservo transform` with the job's settings; it runs in the background."""
        with self._lock:
            if TransformJobName in self._jobs:
                raise ClientError(
                    {"Error": {"Code": "ValidationException",
                               "Message": f"Job name must be unique: {TransformJobName} exists."}},
                    "CreateTransformJob",
                )
        container = self.describe_model(ModelName)["PrimaryContainer"]
        source = TransformInput["DataSource"]["S3DataSource"]
        args = [_local(_model_data(container)), _local(source["S3Uri"]), _local(TransformOutput["S3OutputPath"])]
        # InstanceCount instances on this one machine: the local engine's threads, MaxConcurrentTransforms
        # each (Beam's multi-processing DirectRunner, used before, ran the notebooks' jobs 70x slower)
        instances = int(TransformResources.get("InstanceCount", 1))
        concurrency = MaxConcurrentTransforms * instances if MaxConcurrentTransforms else None
        request = {
            **kwargs, "TransformInput": TransformInput, "TransformOutput": TransformOutput,
            "BatchStrategy": BatchStrategy, "MaxConcurrentTransforms": concurrency,
            "MaxPayloadInMB": MaxPayloadInMB, "DataProcessing": DataProcessing,
        }
        for declared, value in api_values(request):
            if declared.kind is bool:
                args += [declared.flag] if value else []
            else:  # a capture destination may be a file:// URI, as INPUT and OUTPUT are
                args += [declared.flag, _local(str(value))]
        for key, value in {**container.get("Environment", {}), **(Environment or {})}.items():
            args += ["--env", f"{key}={value}"]
        run = TransformRun(TransformJobName, args, child_env(self.env))
        description = {
            "TransformJobName": TransformJobName, "TransformJobArn": self._arn("transform-job", TransformJobName),
            "ModelName": ModelName, "TransformInput": TransformInput, "TransformOutput": TransformOutput,
            "TransformResources": TransformResources, "CreationTime": _now(),
        }
        with self._lock:
            self._jobs[TransformJobName] = (run, description)
        return {"TransformJobArn": description["TransformJobArn"]}

    def transform_run(self, name: str) -> TransformRun:
        with self._lock:
            found = self._jobs.get(name)
        if found is None:
            raise _not_found("transform job", name, "DescribeTransformJob")
        return found[0]

    def describe_transform_job(self, TransformJobName: str) -> dict[str, object]:
        run = self.transform_run(TransformJobName)
        with self._lock:
            description = dict(self._jobs[TransformJobName][1])
        description["TransformJobStatus"] = run.status
        description["TransformStartTime"] = datetime.datetime.fromtimestamp(run.started, datetime.timezone.utc)
        if run.ended is not None:
            description["TransformEndTime"] = datetime.datetime.fromtimestamp(run.ended, datetime.timezone.utc)
        if run.failure_reason:
            description["FailureReason"] = run.failure_reason
        if (progress := run.progress) is not None:  # tfservo's own: SageMaker says nothing until the end
            description["TransformJobProgress"] = progress
        return description

    def stop_transform_job(self, TransformJobName: str) -> dict[str, object]:
        self.transform_run(TransformJobName).stop()
        return {}

    def close(self) -> None:
        """Stop every endpoint and transform job this session started."""
        with self._lock:
            endpoints = list(self._endpoints)
            runs = [run for run, _ in self._jobs.values()]
        for name in endpoints:
            self.delete_endpoint(name)
        for run in runs:
            run.stop()
        shutil.rmtree(self._work, ignore_errors=True)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)
