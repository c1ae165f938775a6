"""Operator logging: one line per event, TensorFlow's own noise off unless asked for."""

from __future__ import annotations

import logging
import os
import sys


def quiet_tensorflow() -> None:
    """Silence TF's C++ and absl start-up chatter; TFSERVO_TF_LOGS=1 keeps it."""
    if os.environ.get("TFSERVO_TF_LOGS") == "1":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def setup_logging(level: str = "info") -> None:
    """Plain one-line logs to stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("absl", "tensorflow", "h5py", "botocore", "s3fs", "fsspec", "aiobotocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
