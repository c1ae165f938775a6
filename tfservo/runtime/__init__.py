"""Runtime: load SavedModel versions and run their signatures on numpy arrays. No HTTP here."""

from tfservo.runtime.signatures import (
    CLASSIFY_METHOD,
    PREDICT_METHOD,
    REGRESS_METHOD,
    SignatureDef,
    TensorSpec,
)

__all__ = [
    "CLASSIFY_METHOD",
    "PREDICT_METHOD",
    "REGRESS_METHOD",
    "SignatureDef",
    "TensorSpec",
]
