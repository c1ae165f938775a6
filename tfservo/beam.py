"""Apache Beam: RunInference model handlers for tfservo bundles and running endpoints.

`BundleModelHandler` loads a bundle in each worker; `RemoteBundleModelHandler` calls a running
tfservo or TF Serving endpoint over REST or gRPC. Both work with Beam's RunInference,
KeyedModelHandler, MaybeKeyedModelHandler and `with_exception_handling()`.

Importing it turns TensorFlow's and Beam's INFO/WARNING noise off in this process (their
errors still show; TFSERVO_TF_LOGS=1 keeps everything): import it before apache_beam to keep
Beam's own import notes quiet too.
"""

from typing import Any

from tfservo.core.extras import require
from tfservo.core.logs import quiet_libraries

quiet_libraries()
require("tfservo.beam", "beam", "apache_beam")

from tfservo.batch.adapters.beam import BundleModelHandler, ServingModelHandler  # noqa: E402
from tfservo.batch.worker.failures import ElementErrors, ElementFailure  # noqa: E402

__all__ = [
    "BundleModelHandler",
    "ElementErrors",
    "ElementFailure",
    "RemoteBundleModelHandler",  # noqa: F822 (module __getattr__, imported on first use)
    "ServingModelHandler",
]


def __getattr__(name: str) -> Any:
    if name == "RemoteBundleModelHandler":  # imports httpx/grpc only when asked for
        from tfservo.batch.adapters.beam_remote import RemoteBundleModelHandler

        return RemoteBundleModelHandler
    raise AttributeError(f"module 'tfservo.beam' has no attribute {name!r}")
