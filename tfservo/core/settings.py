"""Settings, each declared once, and their one resolution: flags, then the environment, then defaults.

A setting is a field of `Settings` declared with `setting(...)`: its name, type and default,
the environment variables that give it when no flag does, `tfservo serve`'s flags and
`tensorflow_model_server`'s (TF Serving's spelling and default), its help and its check. The
options of both command lines and the environment reading are derived from these declarations
(`Option`, `options()`, `tfs_flags()`); inputs that combine into one setting (batching, version
labels) are declared in `INPUTS`. Adding a setting is one declaration plus its use.

`serve`, `invoke`, `inspect`, `transform` (every engine) and the pipeline adapters all call
`resolve_settings` and hand the result to the one service factory
(`tfservo.service.factory.build_service`), so a variable such as
`SAGEMAKER_TFS_DEFAULT_MODEL_NAME` means the same thing whatever front door is used. Nothing
else in tfservo reads SAGEMAKER_* or TFSERVO_* variables. A bad value raises ConfigError
naming the flag or variable; the CLI turns it into a message and an exit status.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tfservo.core import environment as process_env
from tfservo.core import tracing
from tfservo.core.archive_limits import ArchiveLimits
from tfservo.core.batching_options import (
    AUTO_BATCH_THREADS,
    AUTO_MAX_BATCH_SIZE,
    ENABLE_VAR,
    BatchingOptions,
)
from tfservo.core.errors import InvalidArgument
from tfservo.core.memory import memory_limit_bytes, tree_bytes, usable_cores

__all__ = [
    "DEFAULT_MODEL_ENV",
    "INPUTS",
    "INTER_OP_IN_CALLER_THREAD",
    "GROUPS",
    "SMALL_MODELS_BYTES",
    "ConfigError",
    "Group",
    "Option",
    "Settings",
    "TfsFlag",
    "archive_limits_from_env",
    "auto_workers",
    "environment",
    "log_level_from_env",
    "execution_parameters_from_env",
    "grouped_options",
    "is_loopback",
    "option",
    "options",
    "parse_version_labels",
    "resolve_batching",
    "resolve_settings",
    "threads_per_worker",
    "tfs_flags",
]

DEFAULT_MODEL_ENV = "SAGEMAKER_TFS_DEFAULT_MODEL_NAME"
DEFAULT_MODEL_PATH = "/opt/ml/model"
DEFAULT_MODEL_ROOT = "/opt/ml/models"
# Resident memory a loaded SavedModel takes per byte on disk (docs/decisions.md); 0 turns the
# multi-model memory check off.
DEFAULT_MEMORY_FACTOR = 2.0
# Bundles up to this size on disk get one worker per core by default, larger ones one per two
# (auto_workers; measurements: docs/decisions.md, "Fast by default").
SMALL_MODELS_BYTES = 8 * 2**20
# A model session's inter-op threads by default: negative runs each call's ops in the thread
# that made the call (ConfigProto's own meaning), with no hand-off to TF's pool and back;
# kernels still use the intra-op threads. Measurements: docs/decisions.md.
INTER_OP_IN_CALLER_THREAD = -1


class ConfigError(InvalidArgument):
    """A flag or environment variable whose value cannot work; the message names it."""


@dataclass(frozen=True)
class TfsFlag:
    """A setting's flag on `tensorflow_model_server`: TF Serving's name and default, and how its
    value becomes the setting's (e.g. milliseconds to seconds)."""

    name: str
    default: object
    convert: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Option:
    """One declared setting or input: everything but its value."""

    name: str
    kind: type  # int, float, str or bool (a bool is a flag that only turns on)
    default: object
    flags: tuple[str, ...] = ()  # tfservo serve's, the first as help shows it
    env: tuple[str, ...] = ()  # read in order when no flag gives it
    tfs: TfsFlag | None = None
    help: str = ""
    check: str | None = None  # "positive" | "non_negative" | "at_least_one"
    note: str = ""  # what an environment variable's number means, for its error message
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    existing_file: bool = False
    multiple: bool = False
    group: str = ""  # its concern's key in GROUPS (filled in from that table)


def setting(
    default: object,
    *flags: str,
    help: str = "",
    env: str | tuple[str, ...] = (),
    tfs: TfsFlag | None = None,
    check: str | None = None,
    note: str = "",
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    existing_file: bool = False,
) -> Any:
    """A Settings field with its declaration (the rest of Option comes from the field)."""
    spec = dict(flags=flags, env=(env,) if isinstance(env, str) else env, tfs=tfs, help=help, check=check,
                note=note, choices=choices, metavar=metavar, existing_file=existing_file)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"option": spec})
    return field(default=default, metadata={"option": spec})


def _ms_to_seconds(ms: int) -> float:
    return ms / 1000 if ms > 0 else 0.0


_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Settings:
    """Everything that decides how a bundle is loaded and served, resolved once."""

    paths: tuple[str, ...] = ()
    # which model answers a request that names none; None: the first model by name
    default_model_name: str | None = setting(
        None, env=DEFAULT_MODEL_ENV,
        help="The model that answers a request naming none, as the SageMaker container's variable "
        "[default: the first model by name].")
    version_labels: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    intra_op_threads: int = setting(
        0, "--intra-op-threads", env="SAGEMAKER_TFS_INTRA_OP_PARALLELISM",
        tfs=TfsFlag("tensorflow_intra_op_parallelism", 0),
        help="TF intra-op threads [default: $SAGEMAKER_TFS_INTRA_OP_PARALLELISM, else a serving worker's share of "
        "the usable cores, at least 1; TF's choice in-process].")
    inter_op_threads: int = setting(
        INTER_OP_IN_CALLER_THREAD, "--inter-op-threads", env="SAGEMAKER_TFS_INTER_OP_PARALLELISM",
        tfs=TfsFlag("tensorflow_inter_op_parallelism", 0),
        help="TF inter-op threads: -1 runs a call's ops in the thread that made it, 0 lets TF choose "
        "[default: $SAGEMAKER_TFS_INTER_OP_PARALLELISM or -1].")
    batching: BatchingOptions | None = None  # from INPUTS' enable_batching, batching_parameters_file, batching_eager
    # SageMaker multi-model mode: no default model, /ping = "up"
    multi_model: bool = setting(
        False, "--multi-model", env="SAGEMAKER_MULTI_MODEL",
        help="SageMaker multi-model mode: start with no models; POST /models loads one from under "
        "--model-root [default: $SAGEMAKER_MULTI_MODEL=true].")
    model_root: str = setting(
        DEFAULT_MODEL_ROOT, "--model-root", metavar="DIR",
        help="Multi-model mode: the only dir models may be loaded from, or an s3:// prefix whose archives "
        "X-Amzn-SageMaker-Target-Model names [default: /opt/ml/models].")
    memory_factor: float = setting(
        DEFAULT_MEMORY_FACTOR, env="TFSERVO_MME_MEMORY_FACTOR", note="0 turns the memory check off",
        help="Multi-model mode: the resident memory a model is expected to take per byte on disk, checked "
        "before it loads [default: 2; 0: no check].")
    # target models' estimated memory bound; 0: the machine's memory only
    mme_memory_mb: float = setting(
        0.0, env="TFSERVO_MME_MEMORY_MB", note="0 or unset: the machine's memory only",
        help="Multi-model mode: the memory target models may take in all, in MB; past it the least "
        "recently used is unloaded [default: the machine's memory only].")
    model_config_file: str | None = setting(
        None, "--model-config-file", "--model_config_file", existing_file=True,
        tfs=TfsFlag("model_config_file", ""),
        help="TF Serving's text ModelServerConfig: models, base paths, version policies and labels.")
    # TF Serving's --model_name/--model_base_path: one model served as a one-entry model config
    model_base_path: str | None = setting(
        None, help="TF Serving's --model_base_path: one model served as a one-entry model config.")
    model_name: str = setting("default", help="TF Serving's --model_name: the name of --model_base_path's model.")
    file_system_poll_wait_seconds: float = setting(
        0.0, "--file-system-poll-wait-seconds", "--file_system_poll_wait_seconds", check="non_negative",
        tfs=TfsFlag("file_system_poll_wait_seconds", 1, float),
        help="Check model base paths for new or removed version dirs this often [default: 0, never].")
    requirements_dir: str | None = setting(
        None, env="TFSERVO_REQUIREMENTS_DIR",
        help="Where a bundle's code/requirements.txt is installed [default: tfservo-requirements in the temporary folder].")
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)  # model.tar.gz extraction bounds (env)
    reload_code: bool = setting(
        False, "--reload",
        help="Import code/inference.py, code/lib and the bundle's helper modules again when they change, "
        "without reloading the models (a handler that does not import is logged and the previous one kept).")
    # the serving front door (HTTP and gRPC listeners, worker processes)
    host: str = setting(
        "127.0.0.1", "--host", tfs=TfsFlag("rest_api_host", "0.0.0.0"),  # TF Serving listens on all interfaces
        help="Address to listen on [default: 127.0.0.1; 0.0.0.0 under SageMaker].")
    port: int = setting(
        8080, "--port", env="SAGEMAKER_BIND_TO_PORT",
        tfs=TfsFlag("rest_api_port", 0, lambda port: port or 8501),  # TF Serving: 0 is no REST; tfservo always serves it
        help="HTTP port [default: $SAGEMAKER_BIND_TO_PORT or 8080]; 0 picks a free one.")
    grpc_port: int | None = setting(
        9000, "--grpc-port", env="TFSERVO_GRPC_PORT", tfs=TfsFlag("port", 8500),
        help="TF Serving gRPC port [default: 9000]; 0 picks a free one.")
    max_request_mb: float = setting(
        100.0, "--max-request-mb", help="Largest request body accepted, in MB [default: 100]; larger → 413.")
    workers: int = setting(  # 0 (the default): auto_workers()
        0, "--workers", env="SAGEMAKER_GUNICORN_WORKERS", check="at_least_one",
        help="Serving processes sharing the port, each with its own copy of the models "
        "[default: $SAGEMAKER_GUNICORN_WORKERS, else one per core for models of up to 8 MB on disk and one "
        "per two cores for larger ones, as long as each copy of the models fits in memory, at least 1; "
        "1 with --multi-model].")
    no_supervisor: bool = setting(
        False, "--no-supervisor", env="TFSERVO_NO_SUPERVISOR",
        help="Serve in this process alone, without the supervisor that replaces a worker that dies "
        "(os._exit, a segfault, the OOM killer), outgrows --max-worker-memory-mb or reaches --max-requests.")
    max_worker_memory_mb: float = setting(  # 0: from the container's (or machine's) memory
        0.0, "--max-worker-memory-mb", env="TFSERVO_MAX_WORKER_MEMORY_MB", check="non_negative", metavar="MB",
        help="A worker whose resident memory passes this stops taking connections and is replaced "
        "without dropping requests [default: 90% of the container's memory limit, or the machine's, "
        "shared by the workers and one replacement].")
    max_requests: int = setting(
        0, "--max-requests", env="TFSERVO_MAX_REQUESTS", check="non_negative", metavar="N",
        help="Replace a worker once it has answered this many requests, as gunicorn's --max-requests "
        "(the replacement starts first) [default: 0, never].")
    log_level: str = setting(
        "info", "--log-level", env="TFSERVO_LOG_LEVEL", choices=_LEVELS,
        help="Log level [default: info]; debug logs one line per request.")
    log_format: str = setting(
        "text", "--log-format", env="TFSERVO_LOG_FORMAT", choices=("text", "json"),
        help="Log lines as text, or one JSON object per line (time, level, logger, message; trace and "
        "span ids while a trace is active) [default: text].")
    access_log: bool = setting(
        False, "--access-log", env="TFSERVO_ACCESS_LOG",
        help="Log one line per request on tfservo.access: method, path, status, model, version, bytes, "
        "duration, inference id.")
    keep_alive_timeout: float = setting(  # idle keep-alive connections close after this
        5.0, "--keep-alive-timeout", check="positive",
        help="Close an idle keep-alive connection after this many seconds [default: 5].")
    max_header_line_bytes: int = setting(
        8192, "--max-header-line-bytes", env="TFSERVO_MAX_HEADER_LINE_BYTES", check="positive",
        help="The longest request line (else 414) or header line (else 431) a request may have, in bytes "
        "[default: 8192, as nginx].")
    max_header_bytes: int = setting(
        32768, "--max-header-bytes", env="TFSERVO_MAX_HEADER_BYTES", check="positive",
        help="A request's request line and headers in all, in bytes, else 431 [default: 32768, as nginx].")
    header_timeout: float = setting(  # a request's headers must arrive within this
        10.0, "--header-timeout", check="positive",
        help="A request's headers (and, with --tls-cert, the TLS handshake) must arrive within this many "
        "seconds of the connection or the previous answer, else 408 and the connection closes [default: 10].")
    body_timeout: float = setting(  # a body must keep arriving: this long, plus 1 s per min_body_rate bytes
        20.0, "--body-timeout", check="positive", metavar="SECONDS",
        help="A request body must arrive within this many seconds, extended by a second for every "
        "--min-body-rate bytes received, else 408 and the connection closes [default: 20].")
    min_body_rate: int = setting(
        500, "--min-body-rate", check="at_least_one", metavar="BYTES",
        help="Bytes a second a slow body must keep up past --body-timeout [default: 500].")
    max_connections: int = setting(  # open connections per worker; 0: from the file limit
        0, "--max-connections", check="non_negative",
        help="Open connections per worker; past it the oldest idle ones close to make room, and only "
        "when every one is busy does a new one get 503 [default: the process's file limit less 128].")
    idle_poll_us: int = setting(  # after an answer the loop polls this long before it sleeps
        200, "--idle-poll-us", env="TFSERVO_IDLE_POLL_US", check="non_negative", metavar="MICROSECONDS",
        help="After each answer a worker with at most two connections keeps polling them for up to this "
        "long before it sleeps, so a kept-alive client's next request finds it awake; shortened while "
        "requests come further apart [default: 200; 0: off].")
    max_queued_per_model: int = setting(  # invocations of one model waiting for a thread, per worker
        256, "--max-queued-per-model", env="TFSERVO_MAX_QUEUED_PER_MODEL", check="non_negative", metavar="N",
        help="Calls of one model that may wait for a thread while its share of them (48 of 64) is busy, per "
        "pool and worker; past it 503 with Retry-After [default: 256; 0: none wait].")
    max_decoding_mb: float = setting(  # request bodies being decoded at once per server; 0: from memory
        0.0, "--max-decoding-mb", check="non_negative",
        help="Request bodies read and decoded at once, in MB, counted once per server across its workers "
        "(bodies under 64 KiB per worker); past it a request gets 503 with Retry-After "
        "[default: an eighth of the memory available at start].")
    execution_parameters: Mapping[str, object] = field(default_factory=dict)  # (env)
    in_sagemaker: bool = False  # (env: SAGEMAKER_BIND_TO_PORT) the platform in front authenticates callers
    code_only_bundles: bool = False  # a pipeline's container may be code/ alone (no model)
    grpc_port_given: bool = False  # --grpc-port or its variable was given (else a taken 9000 is replaced)
    # SageMaker's runtime API (/endpoints/NAME/invocations): the endpoint this server is (None:
    # answer to any name) and its production variant
    endpoint_name: str | None = setting(
        None, "--endpoint-name", env="TFSERVO_ENDPOINT_NAME", metavar="NAME",
        help="SageMaker runtime API: answer POST /endpoints/NAME/invocations for this name only "
        "[default: $TFSERVO_ENDPOINT_NAME, else any name].")
    variant_name: str = setting(
        "AllTraffic", "--variant-name", env="TFSERVO_VARIANT_NAME", metavar="NAME",
        help="The production variant this server is, named in X-Amzn-Invoked-Production-Variant "
        "[default: $TFSERVO_VARIANT_NAME or AllTraffic].")
    # several bundles as one endpoint: a serial inference pipeline, or production and shadow variants
    pipeline: bool = setting(
        False, "--pipeline", env="TFSERVO_PIPELINE",
        help="The PATHs are one SageMaker inference pipeline, in order: each bundle's answer is the next one's "
        "request (its Content-Type the answer's, Accept the caller's) [default: $TFSERVO_PIPELINE; off: the PATHs' "
        "models are served side by side].")
    pipeline_mode: str = setting(
        "serial", "--pipeline-mode", env="TFSERVO_PIPELINE_MODE", choices=("serial", "direct"),
        help="With --pipeline: serial runs every bundle in turn; direct runs the one that "
        "X-Amzn-SageMaker-Target-Container-Hostname names (InferenceExecutionConfig Mode) [default: serial].")
    container_hostnames: str = setting(
        "", "--container-hostnames", env="TFSERVO_CONTAINER_HOSTNAMES", metavar="NAMES",
        help="With --pipeline: the bundles' ContainerHostnames, comma-separated, as errors and Direct mode "
        "name them [default: container-1, container-2, ...].")
    variants_file: str | None = setting(
        None, "--variants", env="TFSERVO_VARIANTS", existing_file=True, metavar="FILE",
        help="Serve the production variants (and shadow variants) FILE declares (TOML, YAML or JSON): each its own "
        "bundle, weight and settings, traffic split by weight, TargetVariant honoured; instead of PATHs.")
    shadow_queue: int = setting(
        256, "--shadow-queue", env="TFSERVO_SHADOW_QUEUE", check="positive", metavar="N",
        help="Shadow variants: copies of requests waiting for a shadow, per worker; past it a copy is dropped "
        "and counted, never the production answer delayed [default: 256].")
    sigv4_credentials: str | None = setting(
        None, "--sigv4-credentials", env="TFSERVO_SIGV4_CREDENTIALS", existing_file=True, metavar="FILE",
        tfs=TfsFlag("sigv4_credentials", ""),
        help="SageMaker runtime API: accept only requests signed (AWS SigV4, service sagemaker) with a key in FILE, "
        "an AWS shared-credentials file ([profile] with aws_access_key_id and aws_secret_access_key), re-read "
        "when it changes [default: $TFSERVO_SIGV4_CREDENTIALS, else unsigned requests are served].")
    sigv4_replay_window: float = setting(
        0.0, "--sigv4-replay-window", env="TFSERVO_SIGV4_REPLAY_WINDOW", check="non_negative", metavar="SECONDS",
        help="With --sigv4-credentials: refuse a signature already accepted within this many seconds (300 refuses "
        "every replay of a current signature; AWS accepts replays for 5 minutes) [default: 0, off].")
    api_keys: str | None = setting(
        None, "--api-keys", env="TFSERVO_API_KEYS", existing_file=True, metavar="FILE", tfs=TfsFlag("api_keys", ""),
        help="Require an API key (Authorization: Bearer KEY, over HTTP and gRPC metadata) with the route's scope "
        "on every door but health probes (the runtime API takes a key with scope invoke, or a SigV4 signature "
        "with --sigv4-credentials); FILE holds the keys' hashes (tfservo keys new), "
        "re-read when it changes [default: $TFSERVO_API_KEYS, else no keys].")
    open_runtime_api: bool = setting(
        False, "--open-runtime-api", env="TFSERVO_OPEN_RUNTIME_API",
        help="With --api-keys and no --sigv4-credentials: serve SageMaker's runtime API "
        "(/endpoints/NAME/invocations) to callers without a key, as before keys were on "
        "[default: $TFSERVO_OPEN_RUNTIME_API, else it needs a bearer key with scope invoke].")
    auth_failure_limit: int = setting(
        10, "--auth-failure-limit", env="TFSERVO_AUTH_FAILURE_LIMIT", check="positive",
        help="Failed authentications (API keys, SigV4) from one client address before it must wait: 1 s, "
        "doubling at each further failure up to 60 s; forgiven after a quiet minute. Counted once per server, "
        "across doors and workers; raise it for many clients behind one proxy address "
        "[default: $TFSERVO_AUTH_FAILURE_LIMIT or 10].")
    management: str = setting(
        "auto", "--management", env="TFSERVO_MANAGEMENT", choices=("auto", "on", "off"),
        tfs=TfsFlag("management", ""),
        help="The model-management APIs (POST/DELETE /models, V2's repository load/unload, TF Serving's "
        "HandleReloadConfigRequest). auto: on when listening on loopback only, with --api-keys (scope manage) "
        "or in SageMaker's multi-model container (SAGEMAKER_MULTI_MODEL=true), else off; on; off "
        "[default: $TFSERVO_MANAGEMENT or auto].")
    trust_model_code: bool = setting(
        False, "--trust-model-code", env="TFSERVO_TRUST_MODEL_CODE",
        help="Load models that run code or read files of their own on load: a Keras Lambda layer, a class "
        "from outside Keras that nothing registered, a vocabulary read from a path. Off: such a model is "
        "refused, naming what it would run [default: $TFSERVO_TRUST_MODEL_CODE or off].")
    scan_policy: str = setting(
        "auto", "--scan-policy", env="TFSERVO_SCAN_POLICY", choices=("auto", "allow", "warn", "refuse"),
        help="What loading does with a model whose graph can touch files or the network or run Python, or "
        "whose assets point outside it (`tfservo scan` lists the findings): allow; warn (a log line naming "
        "each); refuse (the version fails to load, naming them). auto: warn for paths given here, refuse for "
        "models from s3://, the management API and X-Amzn-SageMaker-Target-Model [default: $TFSERVO_SCAN_POLICY "
        "or auto].")
    require_signature: str | None = setting(
        None, "--require-signature", env="TFSERVO_REQUIRE_SIGNATURE", metavar="KEYS", existing_file=True,
        help="Load only bundles signed by `tfservo sign` with one of the Ed25519 public keys in KEYS (a PEM "
        "file of one or more keys): an unsigned file, an altered one or a version dir added after signing "
        "fails to load, naming it [default: $TFSERVO_REQUIRE_SIGNATURE or none].")
    shared_memory: str = setting(
        "system", "--shared-memory", env="TFSERVO_SHARED_MEMORY", choices=("system", "off"),
        help="Triton's system shared-memory extension (/v2/systemsharedmemory, gRPC's SystemSharedMemory*): "
        "clients on this host register POSIX shared-memory regions and name them for inputs and outputs "
        "instead of sending the bytes. system: on, for loopback and Unix-socket callers only; off "
        "[default: $TFSERVO_SHARED_MEMORY or system].")
    # SAGEMAKER_MULTI_MODEL=true: SageMaker's multi-model contract, where the platform loads models
    # and authenticates callers (management stays on under --management auto)
    sagemaker_multi_model: bool = False
    # SageMaker Asynchronous Inference (the AsyncInferenceConfig of CreateEndpointConfig)
    async_inference_config: str | None = setting(
        None, "--async-inference-config", env="TFSERVO_ASYNC_INFERENCE_CONFIG", existing_file=True, metavar="FILE",
        help="Serve SageMaker's InvokeEndpointAsync (POST /endpoints/NAME/async-invocations): FILE holds the "
        "AsyncInferenceConfig JSON (OutputConfig.S3OutputPath: an s3:// prefix or a local folder; S3FailurePath; "
        "NotificationConfig topics: SNS ARNs or http(s):// webhooks; ClientConfig.MaxConcurrentInvocationsPerInstance).")
    async_state: str | None = setting(
        None, "--async-state", env="TFSERVO_ASYNC_STATE", metavar="DIR",
        help="Where queued asynchronous requests are kept (a SQLite file; survives restarts) "
        "[default: $TFSERVO_ASYNC_STATE, else tfservo-async/ENDPOINT in the temporary folder].")
    async_input_root: str | None = setting(
        None, "--async-input-root", env="TFSERVO_ASYNC_INPUT_ROOT", metavar="DIR",
        help="Asynchronous requests may name local input files (a path or file:// URL) under DIR "
        "[default: s3:// inputs and request bodies only].")
    # SageMaker Data Capture (the DataCaptureConfig of CreateEndpointConfig)
    data_capture_config: str | None = setting(
        None, "--data-capture-config", env="TFSERVO_DATA_CAPTURE_CONFIG", existing_file=True, metavar="FILE",
        help="Capture sampled invocations as SageMaker Data Capture does: FILE holds the DataCaptureConfig "
        "JSON of CreateEndpointConfig (DestinationS3Uri: an s3:// prefix or a local folder).")
    data_capture_routes: str = setting(
        "invocations", "--data-capture-routes", env="TFSERVO_DATA_CAPTURE_ROUTES", choices=("invocations", "all"),
        help="Routes captured: SageMaker's invocations, or all inference routes (TF Serving's and V2's "
        "too) [default: invocations].")
    data_capture_buffer: str | None = setting(
        None, "--data-capture-buffer", env="TFSERVO_DATA_CAPTURE_BUFFER", metavar="DIR",
        help="Local folder where capture files for an s3:// destination wait for their upload "
        "[default: $TMPDIR/tfservo-capture].")
    data_capture_file_seconds: float = setting(
        60.0, "--data-capture-file-seconds", env="TFSERVO_DATA_CAPTURE_FILE_SECONDS", check="positive",
        metavar="SECONDS", help="Publish (and upload) a capture file after this long [default: 60].")
    data_capture_max_disk_percent: float = setting(
        75.0, "--data-capture-max-disk-percent", env="TFSERVO_DATA_CAPTURE_MAX_DISK_PERCENT", check="positive",
        metavar="PERCENT", help="Pause capture while the disk under its files is this full, as SageMaker does "
        "[default: 75].")
    # KServe's inference logger: requests and answers as CloudEvents
    payload_log_url: str | None = setting(
        None, "--payload-log-url", env="TFSERVO_PAYLOAD_LOG_URL", metavar="URL",
        help="Send each inference request and answer to URL as CloudEvents with KServe's logger "
        "attributes, as KServe's `logger: {url: …}` does (needs tfservo[payload-log]).")
    payload_log_mode: str = setting(
        "all", "--payload-log-mode", env="TFSERVO_PAYLOAD_LOG_MODE", choices=("all", "request", "response"),
        help="What the payload logger sends: requests and answers, or one of them [default: all].")
    payload_log_namespace: str = setting(
        "default", "--payload-log-namespace", env="POD_NAMESPACE", metavar="NAMESPACE",
        help="The namespace attribute of payload log events [default: $POD_NAMESPACE or default].")
    # time limits (0: none); gRPC calls use the client's deadline
    request_timeout: float = setting(
        0.0, "--request-timeout", check="non_negative", metavar="SECONDS",
        tfs=TfsFlag("rest_api_timeout_in_ms", 30000, _ms_to_seconds),
        help="Limit for a TF Serving REST call; past it 504 [default: none].")
    invocation_timeout: float = setting(  # the SageMaker container's gunicorn timeout, 30 s by default
        30.0, "--invocation-timeout", env="SAGEMAKER_GUNICORN_TIMEOUT_SECONDS", check="non_negative",
        metavar="SECONDS", note="seconds; 0: no limit",
        help="Limit for an invocation, handlers included; past it 504 "
        "[default: $SAGEMAKER_GUNICORN_TIMEOUT_SECONDS or 30, as in the SageMaker container; 0: none].")
    # replay assets.extra/tf_serving_warmup_requests
    warmup: bool = setting(
        True, tfs=TfsFlag("enable_model_warmup", True),
        help="Replay a version's assets.extra/tf_serving_warmup_requests before it serves, as TF Serving does.")
    # classify/regress only on signatures whose method_name says so (off, as in TF Serving: TF2's
    # tf.saved_model.save writes tensorflow/serving/predict on every signature)
    signature_method_name_check: bool = setting(
        False, "--enable-signature-method-name-check", "--enable_signature_method_name_check",
        tfs=TfsFlag("enable_signature_method_name_check", False),
        help="Classify and regress only with signatures whose method_name is classify or regress, as "
        "TF Serving does with this flag [default: off, as in TF Serving; TF2 exports mark every "
        "signature predict].")
    model_config_poll_seconds: float = setting(  # re-read --model-config-file this often (0: never)
        0.0, "--model-config-file-poll-wait-seconds", check="non_negative",
        tfs=TfsFlag("model_config_file_poll_wait_seconds", 0, float),
        help="Re-read --model-config-file this often and apply changes [default: 0, never].")
    monitoring_config_file: str | None = setting(  # TF Serving's MonitoringConfig: its metric names at its path
        None, "--monitoring-config-file", existing_file=True, tfs=TfsFlag("monitoring_config_file", ""),
        help="TF Serving's MonitoringConfig: its Prometheus metric names at its path.")
    grpc_host: str | None = setting(
        None, tfs=TfsFlag("grpc_host", "0.0.0.0"), help="Address gRPC listens on [default: --host's].")
    prefer_tflite_model: bool = setting(
        False, "--prefer-tflite-model", tfs=TfsFlag("prefer_tflite_model", False),
        help="Where a version dir holds both, serve model.tflite instead of the SavedModel, as TF "
        "Serving's --prefer_tflite_model does [default: the SavedModel; a dir with only model.tflite serves it].")
    tflite_interpreters: int = setting(  # TFLite interpreters per version: calls that run at once
        1, env="TFSERVO_TFLITE_INTERPRETERS", check="at_least_one",
        tfs=TfsFlag("num_tflite_interpreters_per_pool", 1),
        help="TFLite interpreters per model version: its calls that may run at once [default: 1].")
    # TensorFlow's ProfilerService on the gRPC port (tf.profiler.experimental.client.trace, TensorBoard)
    profiler: bool = setting(
        True, env="TFSERVO_ENABLE_PROFILER", tfs=TfsFlag("enable_profiler", True), note="false: no ProfilerService",
        help="Serve TensorFlow's ProfilerService on the gRPC port [default: on; false: off].")
    grpc_socket_path: str | None = setting(
        None, "--grpc-socket-path", "--grpc_socket_path", tfs=TfsFlag("grpc_socket_path", ""), metavar="PATH",
        help="Also serve gRPC (TF Serving's and V2 services, health) on this Unix socket, as TF Serving does.")
    # gRPC connection limits (HTTP/2's own, in place of the HTTP port's connection hygiene)
    grpc_max_concurrent_streams: int = setting(
        128, "--grpc-max-concurrent-streams", check="at_least_one", metavar="N",
        help="Calls one gRPC connection may have open at once; a client's further calls wait for one to "
        "end [default: 128, as nginx].")
    grpc_max_connection_idle: float = setting(
        300.0, "--grpc-max-connection-idle", check="non_negative", metavar="SECONDS",
        help="Close a gRPC connection that has had no call for this long; its client reconnects when it "
        "next calls [default: 300; 0: never].")
    grpc_max_connection_age: float = setting(
        0.0, "--grpc-max-connection-age", check="non_negative", metavar="SECONDS",
        help="Ask a gRPC client to reconnect once its connection is this old, so load spreads over new "
        "instances; its calls in flight get 30 s more [default: 0, never].")
    grpc_channel_arguments: str = setting(
        "", "--grpc-channel-arguments", tfs=TfsFlag("grpc_channel_arguments", ""), metavar="NAME=VALUE,...",
        help="gRPC core arguments for the server, comma separated, as TF Serving's --grpc_channel_arguments "
        "(e.g. grpc.max_connection_age_ms=60000); they override the gRPC settings above.")
    ssl_config_file: str | None = setting(  # TF Serving's SSLConfig for gRPC
        None, "--ssl-config-file", existing_file=True, tfs=TfsFlag("ssl_config_file", ""),
        help="TF Serving's SSLConfig (server_key, server_cert, custom_ca, client_verify): TLS for gRPC.")
    tls_cert: str | None = setting(  # HTTPS for the HTTP port
        None, "--tls-cert", existing_file=True,
        help="HTTPS on the HTTP port: the server certificate (PEM), with --tls-key.")
    tls_key: str | None = setting(None, "--tls-key", existing_file=True, help="HTTPS: the server's private key (PEM).")
    tls_ca: str | None = setting(  # with it, clients must present a certificate it signed
        None, "--tls-ca", existing_file=True,
        help="HTTPS: clients must present a certificate signed by this CA (PEM).")

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    @property
    def max_decoding_bytes(self) -> int | None:
        """--max-decoding-mb in bytes; None: the front door derives it from the memory available."""
        return int(self.max_decoding_mb * 2**20) if self.max_decoding_mb > 0 else None

    def management_open(self) -> tuple[bool, str]:
        """Whether the model-management APIs are served, and why (the start-up line says it)."""
        if self.management != "auto":
            return self.management == "on", f"--management {self.management}"
        if self.api_keys:
            return True, "keys with scope manage (--api-keys)"
        if self.sagemaker_multi_model:
            return True, "SageMaker's multi-model container (SAGEMAKER_MULTI_MODEL=true)"
        hosts = {self.host} | ({self.grpc_host or self.host} if self.grpc_port is not None else set())
        if all(is_loopback(host) for host in hosts):
            return True, "listening on loopback only"
        return False, f"listening on {', '.join(sorted(hosts))} without --api-keys"

    def replace(self, **changes: object) -> Settings:
        """A copy with some fields changed (e.g. a loopback server's host and ports)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


# Inputs that combine into one setting: batching (Settings.batching) and version labels.
INPUTS: tuple[Option, ...] = (
    Option("version_labels", str, (), ("--version-label",), metavar="MODEL:LABEL=VERSION", multiple=True,
           help="Name a version for /v1/models/MODEL/labels/LABEL (repeatable)."),
    Option("enable_batching", bool, False, ("--enable-batching",), tfs=TfsFlag("enable_batching", False),
           help="Merge concurrent requests into one model call [default: $SAGEMAKER_TFS_ENABLE_BATCHING]; "
           "sizes from SAGEMAKER_TFS_MAX_BATCH_SIZE (8), SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS (1000), ..."),
    Option("batching_parameters_file", str, None, ("--batching-parameters-file",), existing_file=True,
           tfs=TfsFlag("batching_parameters_file", ""),
           help="TF Serving batching parameters (text proto: max_batch_size, batch_timeout_micros, "
           "num_batch_threads, max_enqueued_batches, allowed_batch_sizes); turns batching on."),
    Option("batching", str, "auto", ("--batching",), env=("TFSERVO_BATCHING",),
           choices=("auto", "timeout", "eager", "off"),
           help="How concurrent requests share model calls: auto runs a lone request at once and merges "
           "those that arrive while a batch runs; timeout is TF Serving's (as --enable-batching); eager "
           "as --batching-eager; off. SAGEMAKER_TFS_ENABLE_BATCHING and TF Serving's --enable_batching, "
           "when set, choose timeout or off [default: $TFSERVO_BATCHING or auto]."),
    Option("batching_eager", bool, False, ("--batching-eager",), env=("TFSERVO_BATCHING_EAGER",),
           help="With batching on: run a batch as soon as a batch thread is free instead of waiting "
           "for the timeout [default: $TFSERVO_BATCHING_EAGER]."),
)


@dataclass(frozen=True)
class Group:
    """A concern that settings are grouped by, in `serve --help` and the settings reference
    (the attributes of `Settings` keep their flat names, as users set them)."""

    key: str
    title: str
    names: tuple[str, ...]


# Every declared setting and input belongs to exactly one group (tests/core/test_settings.py).
GROUPS: tuple[Group, ...] = (
    Group("models", "Models and versions", (
        "default_model_name", "version_labels", "model_config_file", "model_base_path", "model_name",
        "file_system_poll_wait_seconds", "model_config_poll_seconds", "requirements_dir", "reload_code", "warmup",
        "signature_method_name_check", "prefer_tflite_model", "tflite_interpreters", "intra_op_threads",
        "inter_op_threads")),
    Group("multi_model", "Multi-model endpoints", ("multi_model", "model_root", "memory_factor", "mme_memory_mb")),
    Group("batching", "Batching", ("enable_batching", "batching_parameters_file", "batching", "batching_eager")),
    Group("server", "Listeners and workers", (
        "host", "port", "grpc_port", "workers", "no_supervisor", "max_worker_memory_mb", "max_requests",
        "endpoint_name", "variant_name")),
    Group("endpoint", "Pipelines and variants", (
        "pipeline", "pipeline_mode", "container_hostnames", "variants_file", "shadow_queue")),
    Group("limits", "Limits and time limits", (
        "max_request_mb", "request_timeout", "invocation_timeout", "keep_alive_timeout", "max_header_line_bytes",
        "max_header_bytes", "header_timeout", "body_timeout", "min_body_rate", "max_connections", "idle_poll_us",
        "max_queued_per_model", "max_decoding_mb")),
    Group("grpc", "gRPC", (
        "grpc_host", "grpc_socket_path", "grpc_max_concurrent_streams", "grpc_max_connection_idle",
        "grpc_max_connection_age", "grpc_channel_arguments", "profiler")),
    Group("security", "Security", (
        "api_keys", "open_runtime_api", "sigv4_credentials", "sigv4_replay_window", "auth_failure_limit",
        "management", "trust_model_code", "scan_policy", "require_signature", "shared_memory", "tls_cert", "tls_key", "tls_ca", "ssl_config_file")),
    Group("observability", "Logs, metrics and capture", (
        "log_level", "log_format", "access_log", "monitoring_config_file", "data_capture_config",
        "data_capture_routes", "data_capture_buffer", "data_capture_file_seconds", "data_capture_max_disk_percent",
        "payload_log_url", "payload_log_mode", "payload_log_namespace")),
    Group("async", "Asynchronous inference", ("async_inference_config", "async_state", "async_input_root")),
)
_GROUP_OF = {name: group.key for group in GROUPS for name in group.names}


def _declared() -> tuple[Option, ...]:
    hints = typing.get_type_hints(Settings)
    found = []
    for f in dataclasses.fields(Settings):
        spec = f.metadata.get("option")
        if spec is None:
            continue
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        default: object = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        found.append(Option(f.name, kind, default, **spec))
    return tuple(dataclasses.replace(option, group=_GROUP_OF.get(option.name, "")) for option in (*found, *INPUTS))


_OPTIONS = _declared()
_BY_NAME = {option.name: option for option in _OPTIONS}


def options() -> tuple[Option, ...]:
    """Every declared setting and input, in declaration order (the CLI makes its options from these)."""
    return _OPTIONS


def option(name: str) -> Option:
    """The declaration of setting `name`, for messages that name its flag and variable."""
    return _BY_NAME[name]


def grouped_options() -> Iterator[tuple[Group, tuple[Option, ...]]]:
    """The declared settings and inputs by concern, in GROUPS' order, each group's in its order."""
    for group in GROUPS:
        yield group, tuple(_BY_NAME[name] for name in group.names)


def tfs_flags() -> Iterator[Option]:
    """The declarations `tensorflow_model_server` has a flag for."""
    return (option for option in _OPTIONS if option.tfs is not None)


def _from_env(option: Option, env: Mapping[str, str]) -> tuple[object, str | None]:
    for name in option.env:
        if option.kind is bool:
            value: object = _env_bool(env, name, None)
        elif option.kind is int:
            value = _env_int(env, name, None)
        elif option.kind is float:
            value = _env_float(env, name, None, option.note or "a number")
        else:
            value = env.get(name) or None
        if value is not None:
            return value, name
    return None, None


def is_loopback(host: str) -> bool:
    """Whether an address to listen on is reachable from this host only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to may be reachable
        return False


def _check(option: Option, value: Any, source: str) -> Any:
    if option.choices is not None and value is not None and value not in option.choices:
        raise ConfigError(f"{source} is one of {', '.join(option.choices)}, got {value!r}")
    if option.check is None or value is None:
        return value
    if option.check == "at_least_one" and value < 1:
        raise ConfigError(f"{source} must be at least 1, got {value}")
    if option.check == "positive" and value <= 0:
        raise ConfigError(f"{source} must be more than 0, got {value:g}")
    if option.check == "non_negative" and value < 0:
        raise ConfigError(f"{source} must be 0 (off) or more, got {value:g}")
    return value


def _resolve(name: str, flags: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """One setting: its flag if given, else its first environment variable set, else its default."""
    option = _BY_NAME[name]
    given = flags.get(name)
    if given is not None:
        return _check(option, given, option.flags[0] if option.flags else name)
    value, variable = _from_env(option, env)
    if value is not None:
        return _check(option, value, f"environment variable {variable}")
    return option.default


def resolve_settings(
    *,
    paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    serve_default_path: bool = True,
    serving: bool = True,
    **flags: Any,
) -> Settings:
    """Merge flags (keyword arguments named as the declarations; None: not given) over the
    environment over defaults.

    `multi_model=None` reads SAGEMAKER_MULTI_MODEL (serve); callers that always bring a
    bundle (invoke, transform, pipelines) pass False. With no PATH, `serve_default_path`
    serves /opt/ml/model as the SageMaker container does. In-process callers (invoke, inspect,
    transform, pipelines) pass `serving=False`: the defaults chosen for a server — adaptive
    batching, workers from the machine — do not apply there (batching off unless asked for,
    one worker).
    """
    unknown = sorted(set(flags) - set(_BY_NAME))
    if unknown:
        raise TypeError(f"resolve_settings() got unknown settings {', '.join(unknown)}")
    env = process_env.current() if env is None else env
    value = {option.name: _resolve(option.name, flags, env) for option in _OPTIONS if option.name not in _COMBINED}
    if value["multi_model"] and paths:
        raise ConfigError(
            f"multi-model mode starts with no models, but PATH {paths[0]} was given; "
            "drop PATH and load models with POST /models, or drop --multi-model / SAGEMAKER_MULTI_MODEL"
        )
    if len(paths) == 1:
        from tfservo.core.pipeline_file import is_pipeline_file, read_pipeline_file

        if is_pipeline_file(paths[0]):  # a pipeline file stands where a bundle does
            pipeline = read_pipeline_file(paths[0])
            paths = list(pipeline.paths)
            value["pipeline"] = True
            if flags.get("pipeline_mode") is None:
                value["pipeline_mode"] = pipeline.mode
            if not value["container_hostnames"]:
                value["container_hostnames"] = ",".join(pipeline.hostnames)
    sized = list(paths)  # the bundles a worker holds, for the default count of workers
    if value["variants_file"]:
        if paths:
            raise ConfigError(f"give PATHs or --variants {value['variants_file']}, not both: the variants file "
                              "names each variant's bundle")
        from tfservo.core.variants_file import read_variants_file

        endpoint = read_variants_file(value["variants_file"])
        sized = [p for v in (*endpoint.variants, *endpoint.shadows) for p in v.paths]
        serve_default_path = False
    if not value["workers"]:
        chosen = serving and not value["multi_model"] and not value["no_supervisor"]
        value["workers"] = auto_workers(sized, value["memory_factor"]) if chosen else 1
    if serving and not value["intra_op_threads"]:
        value["intra_op_threads"] = threads_per_worker(value["workers"])
    if value["multi_model"] and value["workers"] > 1:
        raise ConfigError(
            "multi-model mode needs one worker (models are loaded into one process); "
            "drop --workers / SAGEMAKER_GUNICORN_WORKERS"
        )
    recycling = [flag for flag, name in (("--max-requests", "max_requests"), ("--max-worker-memory-mb", "max_worker_memory_mb"))
                 if value[name]]
    if value["multi_model"] and recycling:
        raise ConfigError(
            f"multi-model mode cannot recycle its worker ({', '.join(recycling)}): the models loaded with POST "
            "/models live in that one process; bound their memory with TFSERVO_MME_MEMORY_MB instead"
        )
    supervised = [flag for flag, given in (("--workers", value["workers"] > 1), ("--max-requests", value["max_requests"]),
                                           ("--max-worker-memory-mb", value["max_worker_memory_mb"])) if given]
    if value["no_supervisor"] and supervised:
        raise ConfigError(f"{', '.join(supervised)} need(s) the supervisor; drop --no-supervisor "
                          "(TFSERVO_NO_SUPERVISOR) or the flag")
    try:
        tracing.wanted(env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if value["model_config_file"] and value["model_base_path"]:
        raise ConfigError("give --model_config_file or --model_base_path, not both (as TF Serving requires)")
    if not paths and serve_default_path and not value["multi_model"] and not value["model_config_file"] \
            and not value["model_base_path"]:
        paths = [DEFAULT_MODEL_PATH]
    value["grpc_port_given"] = flags.get("grpc_port") is not None or _from_env(_BY_NAME["grpc_port"], env)[0] is not None
    if flags.get("host") is None and "SAGEMAKER_BIND_TO_PORT" in env:
        value["host"] = "0.0.0.0"  # inside SageMaker the platform reaches the container from outside
    if flags.get("max_request_mb") is None:
        value["max_request_mb"] = _default_max_request_mb(env)
    if value["default_model_name"] == "None":  # the container's "unset"
        value["default_model_name"] = None
    _check_tls(value["tls_cert"], value["tls_key"], value["tls_ca"])
    return Settings(
        paths=tuple(paths),
        version_labels=parse_version_labels(flags.get("version_labels") or ()),
        batching=resolve_batching(
            bool(flags.get("enable_batching")), flags.get("batching_parameters_file"), env,
            bool(flags.get("batching_eager")), mode=_resolve("batching", flags, env), auto=serving,
        ),
        execution_parameters=execution_parameters_from_env(env),
        in_sagemaker="SAGEMAKER_BIND_TO_PORT" in env,
        sagemaker_multi_model=bool(value["multi_model"]) and _env_bool(env, "SAGEMAKER_MULTI_MODEL", False) is True,
        archive_limits=archive_limits_from_env(env),
        **value,
    )


_COMBINED = {option.name for option in INPUTS}


def environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with a job's `--env` over it: what settings resolve from
    (handing it on is how a worker gets a job's settings without the environment written)."""
    return {**process_env.current(), **(overrides or {})}


def log_level_from_env(env: Mapping[str, str] | None = None) -> str:
    """The declared log level as the environment gives it (for logging set up before the rest)."""
    return str(_resolve("log_level", {}, process_env.current() if env is None else env))


def _check_tls(cert: str | None, key: str | None, ca: str | None) -> None:
    """--tls-cert and --tls-key come together; --tls-ca needs them."""
    if bool(cert) != bool(key):
        raise ConfigError("HTTPS needs both --tls-cert FILE and --tls-key FILE")
    if ca and not cert:
        raise ConfigError("--tls-ca (client certificates) needs --tls-cert and --tls-key")


def archive_limits_from_env(env: Mapping[str, str]) -> ArchiveLimits:
    """TFSERVO_ARCHIVE_MAX_FILES, TFSERVO_ARCHIVE_MAX_GB and TFSERVO_ARCHIVE_MAX_RATIO."""
    default = ArchiveLimits()
    max_gb = _env_float(env, "TFSERVO_ARCHIVE_MAX_GB", 0.0, "0 or unset: the free disk space")
    limits = ArchiveLimits(
        max_files=_env_int(env, "TFSERVO_ARCHIVE_MAX_FILES", default.max_files),
        max_bytes=int(max_gb * 2**30) if max_gb > 0 else None,
        max_ratio=_env_float(env, "TFSERVO_ARCHIVE_MAX_RATIO", default.max_ratio, "extracted bytes per compressed byte"),
    )
    if limits.max_files <= 0 or limits.max_ratio <= 0:
        raise ConfigError("TFSERVO_ARCHIVE_MAX_FILES and TFSERVO_ARCHIVE_MAX_RATIO must be positive")
    return limits


def auto_workers(paths: Sequence[str] = (), memory_factor: float = DEFAULT_MEMORY_FACTOR) -> int:
    """Workers when none is asked for: one per usable core when the models are small (up to
    `SMALL_MODELS_BYTES` on disk: a request's time is the worker's Python, and such a model's
    batches run on the worker's event loop), else one per two (a worker's event loop takes one,
    its batch and TensorFlow threads the other); as long as each fits in 80 % of the memory with
    its copy of the models (1 GB of TensorFlow plus the bundles' size on disk × `memory_factor`,
    as multi-model loads estimate it; an archive counts as its size, since weights barely
    compress; 4 GB per worker, one per two cores, when a bundle is remote); at least one."""
    size = sum(tree_bytes(p) for p in paths) if all(os.path.exists(path) for path in paths) else None
    factor = memory_factor if memory_factor > 0 else DEFAULT_MEMORY_FACTOR
    per_worker = 2**30 + int(factor * size) if size is not None else 4 * 2**30
    limit = memory_limit_bytes() or 8 * 2**30
    cores = usable_cores()
    wanted = cores if size is not None and size <= SMALL_MODELS_BYTES else cores // 2
    return max(1, min(wanted, int(limit * 0.8) // per_worker))


def threads_per_worker(workers: int) -> int:
    """A serving worker's TensorFlow intra-op threads when none are asked for: its share of the
    usable cores, at least one. TensorFlow's own choice is every core of the machine (not the
    cgroup's quota), in every worker, so workers that each own a core fought over all of them
    (docs/decisions.md, "Fast by default")."""
    return max(1, usable_cores() // workers)


def resolve_batching(
    enable: bool, parameters_file: str | None, env: Mapping[str, str], eager: bool = False,
    *, mode: str = "auto", auto: bool = True,
) -> BatchingOptions | None:
    """The batching `mode` (--batching), or what TF Serving's and SageMaker's settings ask for.

    auto, when nothing else asks for batching: adaptive batching (BatchingOptions.adaptive; off
    when `auto` is False). --enable-batching [--batching-parameters-file],
    SAGEMAKER_TFS_ENABLE_BATCHING=true, or --batching timeout: TF Serving's batching; with
    --batching-eager / TFSERVO_BATCHING_EAGER (or --batching eager) a batch closes as soon as a
    batch thread is free. SAGEMAKER_TFS_ENABLE_BATCHING=false or --batching off: none.
    """
    if mode == "off":
        return None
    forced = enable or eager or bool(parameters_file) or mode in ("timeout", "eager")  # flags (or TFSERVO_BATCHING)
    env_eager = bool(_from_env(_BY_NAME["batching_eager"], env)[0])
    eager = eager or env_eager or mode == "eager"
    said = env.get(ENABLE_VAR, "").strip()  # SageMaker's variable, when set, wins over auto and env_eager
    if not forced and not said and not env_eager:
        return BatchingOptions(max_batch_size=AUTO_MAX_BATCH_SIZE, num_batch_threads=AUTO_BATCH_THREADS,
                               adaptive=True) if auto else None
    options: BatchingOptions | None
    try:
        if parameters_file:
            options = BatchingOptions.from_parameters_file(parameters_file)
        elif forced or not said:
            options = BatchingOptions.from_env({**env, "SAGEMAKER_TFS_ENABLE_BATCHING": "true"})
        else:
            options = BatchingOptions.from_env(env)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"batching settings: {exc}") from None
    return dataclasses.replace(options, eager=True) if options is not None and eager else options


def execution_parameters_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """GET /execution-parameters: what SageMaker batch transform asks a container for.

    SageMaker sets SAGEMAKER_BATCH_STRATEGY as MULTI_RECORD / SINGLE_RECORD; the endpoint
    answers the API's spelling (MultiRecord / SingleRecord).
    """
    raw = env.get("SAGEMAKER_BATCH_STRATEGY") or "MultiRecord"
    strategy = _BATCH_STRATEGIES.get(raw.replace("_", "").replace("-", "").lower())
    if strategy is None:
        raise ConfigError(
            f"environment variable SAGEMAKER_BATCH_STRATEGY={raw!r} must be "
            "MultiRecord (MULTI_RECORD) or SingleRecord (SINGLE_RECORD)"
        )
    return {
        "MaxConcurrentTransforms": _env_int(env, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", os.cpu_count() or 1),
        "BatchStrategy": strategy,
        "MaxPayloadInMB": _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6),
    }


def parse_version_labels(specs: Sequence[str]) -> dict[str, dict[str, int]]:
    """`MODEL:LABEL=VERSION` flags → {model: {label: version}}."""
    labels: dict[str, dict[str, int]] = {}
    for spec in specs:
        model, sep, rest = spec.partition(":")
        label, eq, version = rest.partition("=")
        if not (sep and eq and model and label and version.isdigit()):
            raise ConfigError(
                f"--version-label {spec!r} is not MODEL:LABEL=VERSION (e.g. half_plus_two:stable=123)"
            )
        labels.setdefault(model, {})[label] = int(version)
    return labels


_D = TypeVar("_D")  # what an unset variable gives
_BATCH_STRATEGIES = {"multirecord": "MultiRecord", "singlerecord": "SingleRecord"}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _env_int(env: Mapping[str, str], name: str, default: _D) -> int | _D:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} must be an integer") from None


def _env_float(env: Mapping[str, str], name: str, default: _D, note: str) -> float | _D:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} must be a number ({note})") from None


def _env_bool(env: Mapping[str, str], name: str, default: _D) -> bool | _D:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"environment variable {name}={raw!r} must be 'true' or 'false'")


def _default_max_request_mb(env: Mapping[str, str]) -> float:
    """100 MB; in a SageMaker batch job (SAGEMAKER_BATCH=true) at least the payload it will send."""
    if env.get("SAGEMAKER_BATCH", "").lower() == "true":
        return float(max(100, _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6)))
    return 100.0
