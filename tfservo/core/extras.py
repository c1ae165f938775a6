"""Optional dependencies: the lean install leaves out Beam, Ray, Spark, scikit-learn, the
SageMaker SDK and the rest; a feature that needs one imports it here and, when it is missing,
fails with a message naming the extra that brings it (`pip install 'tfservo[beam]'`)."""

from __future__ import annotations

import importlib
from types import ModuleType

from tfservo.core.errors import FailedPrecondition

__all__ = ["EXTRAS", "MissingExtra", "require"]

# extra -> what it brings (pyproject.toml's [project.optional-dependencies] holds the packages)
EXTRAS: dict[str, str] = {
    "beam": "Apache Beam: tfservo.beam's RunInference handlers and --runner beam",
    "ray": "Ray Data: tfservo.ray and --runner ray",
    "spark": "PySpark: tfservo.spark's pandas UDFs and --runner spark (Spark needs a Java 17 JRE)",
    "evaluate": "scikit-learn and matplotlib: tfservo evaluate",
    "sagemaker": "the SageMaker Python SDK and moto's S3: tfservo.sagemaker_sdk",
    "ui": "Swagger UI's assets: GET /docs",
    "otel": "OpenTelemetry's SDK and OTLP exporters: traces from OTEL_* variables",
    "payload-log": "CloudEvents: --payload-log-url",
    "all": "every extra above",
}


class MissingExtra(FailedPrecondition, ImportError):
    """A feature's optional dependency is not installed; the message names the extra to install.

    An ImportError too, so `import tfservo.beam` without Beam fails the way Python users expect,
    and a ServingError, so the command lines print it as one line."""

    def __init__(self, feature: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{feature} needs {missing}, which the lean install leaves out: pip install 'tfservo[{extra}]'"
        )
        self.extra = extra
        self.name = missing


def require(feature: str, extra: str, module: str) -> ModuleType:
    """Import `module` for `feature`, or raise MissingExtra naming `extra`."""
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or module).split(".")[0]
        raise MissingExtra(feature, extra, top) from None
