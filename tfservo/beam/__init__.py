"""Apache Beam: RunInference model handlers for tfservo bundles and running endpoints.

`BundleModelHandler` loads a bundle in each worker; `RemoteBundleModelHandler` calls a running
tfservo or TF Serving endpoint over REST or gRPC. Both work with Beam's RunInference,
KeyedModelHandler, MaybeKeyedModelHandler and `with_exception_handling()`.
"""

from tfservo.beam.failures import ElementErrors, ElementFailure
from tfservo.beam.handler import BundleModelHandler, ServingModelHandler

__all__ = [
    "BundleModelHandler",
    "ElementErrors",
    "ElementFailure",
    "RemoteBundleModelHandler",
    "ServingModelHandler",
]


def __getattr__(name: str):
    if name == "RemoteBundleModelHandler":  # imports httpx/grpc only when asked for
        from tfservo.beam.remote import RemoteBundleModelHandler

        return RemoteBundleModelHandler
    raise AttributeError(f"module 'tfservo.beam' has no attribute {name!r}")
