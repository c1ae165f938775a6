"""Models: SavedModel loading and signatures (the runtime), servables and their handles, version
lifecycle, model config, warmup, bundles and multi-model loading, batching. No HTTP here.

`load_saved_model` and `LoadedModel` are imported lazily, so importing the package (or
`signatures`) does not pull in TensorFlow. TensorFlow's C++ logs are quieted to errors unless
the user set TF_CPP_MIN_LOG_LEVEL themselves.
"""

import os
from typing import Any

from tfservo.models.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    REGRESS_METHOD,
    SignatureDef,
    TensorSpec,
)

QUIET_TENSORFLOW = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = [
    "CLASSIFY_METHOD",
    "DEFAULT_SIGNATURE",
    "PREDICT_METHOD",
    "REGRESS_METHOD",
    "LoadedModel",
    "SignatureDef",
    "TensorSpec",
    "load_saved_model",
]


def __getattr__(name: str) -> Any:
    if name in ("load_saved_model", "LoadedModel"):
        from tfservo.models import savedmodel

        return getattr(savedmodel, name)
    raise AttributeError(f"module 'tfservo.models' has no attribute {name!r}")
