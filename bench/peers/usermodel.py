"""The TensorFlow code a user writes for the hand-built peers: load the SavedModel, call its
serving signature (TF's documented path), decode base64 JPEGs. Shared by every peer server so
that they differ only in the serving framework.
"""

from __future__ import annotations

import base64
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf


class SignatureModel:
    """`tf.saved_model.load(path).signatures["serving_default"]` on numpy batches."""

    def __init__(self, path: str) -> None:
        self.loaded = tf.saved_model.load(path)
        self.fn = self.loaded.signatures["serving_default"]
        self.input = next(iter(self.fn.structured_input_signature[1]))
        self.output = next(iter(self.fn.structured_outputs))

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.fn(**{self.input: tf.constant(batch, tf.float32)})[self.output].numpy()


def decode_jpegs(b64_images: list[str | bytes]) -> np.ndarray:
    """Base64 JPEG strings → a float32 batch of RGB pixels."""
    return np.stack(
        [tf.io.decode_jpeg(base64.b64decode(b), channels=3).numpy() for b in b64_images]
    ).astype(np.float32)


def rows_from_instances(instances: list) -> np.ndarray:
    """TF Serving `instances`: numbers as nested lists, or [{"b64": JPEG}, ...]."""
    if instances and isinstance(instances[0], dict):
        return decode_jpegs([inst["b64"] for inst in instances])
    return np.asarray(instances, dtype=np.float32)
