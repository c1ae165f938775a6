"""SageMaker's AsyncInferenceConfig (CreateEndpointConfig's, the SDK's AsyncInferenceConfig) as
tfservo reads it: where answers and failures go, whom to notify, how many run at once."""

from __future__ import annotations

from dataclasses import dataclass

from tfservo.core.json_files import read_json_file
from tfservo.core.settings import ConfigError

__all__ = ["AsyncConfig", "read_async_config", "DEFAULT_MAX_CONCURRENT"]

FLAG = "--async-inference-config"
DEFAULT_MAX_CONCURRENT = 4  # SageMaker picks one per instance type; this is a 2-core machine's
_INCLUDE = ("SUCCESS_NOTIFICATION_TOPIC", "ERROR_NOTIFICATION_TOPIC")


@dataclass(frozen=True)
class AsyncConfig:
    """Where a request's answer (`{output_path}/{InferenceId}.out`) and failure
    (`{failure_path}/{InferenceId}-error.out`) go, and whom to tell. A topic is an SNS ARN or,
    for users without SNS, an http(s):// URL that gets the same JSON message."""

    output_path: str
    failure_path: str
    success_topic: str | None = None
    error_topic: str | None = None
    include_response_in: frozenset[str] = frozenset()
    max_concurrent: int = DEFAULT_MAX_CONCURRENT


def read_async_config(path: str) -> AsyncConfig:
    """The AsyncInferenceConfig JSON at `path`; ConfigError naming the field that is wrong."""
    doc = read_json_file(path, FLAG)
    if not isinstance(doc, dict):
        raise ConfigError(f"{FLAG} {path}: expected a JSON object with OutputConfig")
    doc = doc.get("AsyncInferenceConfig", doc)  # CreateEndpointConfig's wrapper, or the object itself
    output = doc.get("OutputConfig")
    if not isinstance(output, dict) or not isinstance(output.get("S3OutputPath"), str) or not output["S3OutputPath"]:
        raise ConfigError(f"{FLAG} {path}: OutputConfig.S3OutputPath is required (an s3:// prefix or a local folder)")
    notification = output.get("NotificationConfig") or {}
    if not isinstance(notification, dict):
        raise ConfigError(f"{FLAG} {path}: OutputConfig.NotificationConfig must be an object")
    include = notification.get("IncludeInferenceResponseIn") or []
    unknown = [value for value in include if value not in _INCLUDE]
    if unknown:
        raise ConfigError(f"{FLAG} {path}: IncludeInferenceResponseIn takes {' and '.join(_INCLUDE)}, got {unknown}")
    client = doc.get("ClientConfig") or {}
    concurrent = client.get("MaxConcurrentInvocationsPerInstance", DEFAULT_MAX_CONCURRENT)
    if not isinstance(concurrent, int) or isinstance(concurrent, bool) or not 1 <= concurrent <= 1000:
        raise ConfigError(f"{FLAG} {path}: ClientConfig.MaxConcurrentInvocationsPerInstance is 1 to 1000, got {concurrent!r}")
    output_path = output["S3OutputPath"].rstrip("/")
    failure = output.get("S3FailurePath")
    return AsyncConfig(
        output_path=output_path,
        failure_path=failure.rstrip("/") if isinstance(failure, str) and failure else output_path,
        success_topic=notification.get("SuccessTopic") or None,
        error_topic=notification.get("ErrorTopic") or None,
        include_response_in=frozenset(include),
        max_concurrent=concurrent,
    )
