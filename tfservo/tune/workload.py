"""The requests `tfservo tune` sends: a user's own request body (to /invocations, through the
bundle's handlers as SageMaker sends it), or rows generated from the model's signature and
written in each protocol measured (TF Serving's JSON, V2's binary tensors, TF Serving's gRPC).

The signature is read from the running server's V2 metadata, so what is generated matches
what the server serves (the default model and its serving_default signature).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tfservo.core.settings import ConfigError

__all__ = ["PROTOCOLS", "Workload", "generated_workload", "invocations_workload"]

# protocol name → what the table calls it
PROTOCOLS = {
    "invocations": "SageMaker /invocations (the request file, through the handlers)",
    "tfs-json": "TF Serving REST JSON",
    "v2-binary": "V2 REST, binary tensors",
    "grpc": "TF Serving gRPC Predict",
}

_NUMPY_OF_V2 = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


@dataclass(frozen=True)
class Workload:
    """One request per protocol it can be sent in: (path or gRPC method, body, headers)."""

    model: str
    rows: int
    requests: dict[str, tuple[str, bytes, dict[str, str]]]
    source: str  # where the request came from, for the report

    @property
    def protocols(self) -> list[str]:
        return list(self.requests)


def invocations_workload(path: str, content_type: str, accept: str | None) -> Workload:
    """The user's request file, sent as it is to /invocations (the whole file is one body)."""
    try:
        with open(path, "rb") as f:
            body = f.read()
    except OSError as exc:
        raise ConfigError(f"--requests {path}: cannot read it ({exc.strerror}); name a file holding one request body") from None
    if not body:
        raise ConfigError(f"--requests {path} is empty; it should hold one request body, as a client sends it")
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    return Workload("", 0, {"invocations": ("/invocations", body, headers)}, f"{path} ({len(body)} bytes, {content_type})")


def generated_workload(metadata: dict[str, Any], rows: int, seed: int = 0) -> Workload:
    """`rows` generated rows for the inputs V2's model metadata lists, in every generated protocol."""
    model = str(metadata.get("name", ""))
    inputs = metadata.get("inputs") or []
    if not inputs:
        raise ConfigError(f"model {model} has no inputs in its serving_default signature; pass --requests FILE")
    rng = np.random.default_rng(seed)
    arrays = {str(spec["name"]): _sample(spec, rows, rng, model) for spec in inputs}
    requests = {
        "tfs-json": (f"/v1/models/{model}:predict", _tfs_json(arrays), {"Content-Type": "application/json"}),
        "v2-binary": (f"/v2/models/{model}/infer", *_v2_binary(arrays)),
        "grpc": ("/tensorflow.serving.PredictionService/Predict", _predict_request(model, arrays), {}),
    }
    shapes = ", ".join(f"{k} {a.dtype.name if a.dtype != object else 'bytes'}{list(a.shape)}" for k, a in arrays.items())
    return Workload(model, rows, requests, f"generated from the signature: {shapes}")


def _sample(spec: dict[str, Any], rows: int, rng: np.random.Generator, model: str) -> np.ndarray:
    datatype = str(spec.get("datatype"))
    dtype = _NUMPY_OF_V2.get(datatype)
    if dtype is None:
        raise ConfigError(f"model {model} input {spec.get('name')}: cannot generate {datatype}; pass --requests FILE")
    dims = [int(d) for d in spec.get("shape", [-1])]
    shape = [rows] + [2 if d < 0 else d for d in dims[1:]] if dims else []
    if dtype is np.object_:
        words = np.array([b"a", b"b", b"red", b"green"], dtype=object)
        return words[rng.integers(0, len(words), shape)]
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 4, shape).astype(dtype)


def _tfs_json(arrays: dict[str, np.ndarray]) -> bytes:
    def plain(a: np.ndarray) -> Any:
        if a.dtype == object:
            return np.vectorize(lambda x: x.decode(), otypes=[object])(a).tolist()
        return a.tolist()

    if len(arrays) == 1:
        (array,) = arrays.values()
        return orjson.dumps({"instances": plain(array)})
    return orjson.dumps({"inputs": {k: plain(a) for k, a in arrays.items()}})


def _v2_binary(arrays: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """V2's binary tensor extension: a JSON header, then each input's raw bytes."""
    blobs, specs = [], []
    for name, a in arrays.items():
        if a.dtype == object:
            raw = b"".join(struct.pack("<I", len(x)) + x for x in a.ravel())
            datatype = "BYTES"
        else:
            raw = np.ascontiguousarray(a).tobytes()
            datatype = next(k for k, v in _NUMPY_OF_V2.items() if v is not np.object_ and np.dtype(v) == a.dtype)
        blobs.append(raw)
        specs.append({"name": name, "shape": list(a.shape), "datatype": datatype,
                      "parameters": {"binary_data_size": len(raw)}})
    header = json.dumps({"inputs": specs}).encode()
    return header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(header))}


def _predict_request(model: str, arrays: dict[str, np.ndarray]) -> bytes:
    from tensorflow_serving.apis import predict_pb2

    from tfservo.codecs.tensor_proto import write_tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, a in arrays.items():
        write_tensor_proto(a, request.inputs[name], name)
    return bytes(request.SerializeToString())
