"""tfservo: serve SageMaker-style TensorFlow model bundles without Docker, AWS or TF Serving's binary.

The public API for library use, imported on first access so `import tfservo` stays light:
`BundleModelHandler`, `RemoteBundleModelHandler` (Beam), `BundlePredictor` (Ray Data),
`bundle_predict_udf` and `bundle_predict_frames` (Spark), `Session` (the SageMaker SDK),
`Settings` and `resolve_settings` (settings), `build_service` (the service factory).
"""

from importlib import import_module
from typing import Any

from tfservo.core.version import __version__

_PUBLIC = {
    "BundleModelHandler": "tfservo.beam",
    "RemoteBundleModelHandler": "tfservo.beam",
    "BundlePredictor": "tfservo.ray",
    "bundle_predict_udf": "tfservo.spark",
    "bundle_predict_frames": "tfservo.spark",
    "Session": "tfservo.sagemaker_sdk",
    "Settings": "tfservo.core.settings",
    "resolve_settings": "tfservo.core.settings",
    "build_service": "tfservo.service.factory",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tfservo' has no attribute {name!r}")
    return getattr(import_module(module), name)
