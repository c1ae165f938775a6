"""Which functions of an inference.py are its handlers, decided once for the import that runs
them (bundle_code) and for the check before TensorFlow (service.preflight)."""

from __future__ import annotations

from tfservo.core.errors import BundleError

__all__ = ["HANDLER_NAMES", "chosen_handlers"]

HANDLER_NAMES = ("handler", "input_handler", "output_handler")


def chosen_handlers(defined: set[str], path: str) -> tuple[str, ...]:
    """The handler names that run, of those `path` defines: ("handler",) alone, or both
    ("input_handler", "output_handler"); a BundleError when neither is whole."""
    if "handler" in defined:
        return ("handler",)
    if {"input_handler", "output_handler"} <= defined:
        return ("input_handler", "output_handler")
    if "input_handler" in defined or "output_handler" in defined:
        present, missing = ("input_handler", "output_handler")
        if "output_handler" in defined:
            present, missing = missing, present
        raise BundleError(
            f"{path} defines {present} but not {missing}; define both, or one "
            "handler(data, context) that does the whole request"
        )
    raise BundleError(
        f"{path} defines no handlers; define handler(data, context), or both "
        "input_handler(data, context) and output_handler(response, context)"
    )
