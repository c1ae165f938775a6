"""Models: SavedModel loading and signatures (the runtime), servables and their handles, version
lifecycle, model config, bundles, batching, and the typed calls and answers (`calls`). No HTTP here.

`load_saved_model` and `LoadedModel` are imported lazily, so importing the package (or
`signatures`) does not pull in TensorFlow. TensorFlow's C++ logs are quieted to errors unless
the user set TF_CPP_MIN_LOG_LEVEL themselves (or TFSERVO_TF_LOGS=1).
"""

from typing import Any

from tfservo.core.logs import quiet_tensorflow_env
from tfservo.models.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    REGRESS_METHOD,
    SignatureDef,
    TensorSpec,
)

QUIET_TENSORFLOW = quiet_tensorflow_env()  # before anything imports TensorFlow

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
