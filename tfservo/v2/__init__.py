"""The Open Inference Protocol (KServe V2): tensors ↔ arrays, and its data plane over the TF
Serving API (the same model selection, batching and runtime as every other front door)."""

from tfservo.v2.codec import V2Error, decode_inputs, encode_outputs
from tfservo.v2.dataplane import V2DataPlane

__all__ = ["V2DataPlane", "V2Error", "decode_inputs", "encode_outputs"]
