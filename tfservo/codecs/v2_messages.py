"""V2 REST bodies: an inference request (JSON, or JSON then binary tensors with the binary data
extension) into an InferRequest, and an InferResponse back into the caller's shape."""

from __future__ import annotations

import orjson

from tfservo.codecs.v2 import (
    SharedRead,
    SharedWrite,
    V2Error,
    decode_inputs,
    encode_outputs,
    parameters_of,
    shared_span,
)
from tfservo.models.calls import InferRequest, InferResponse

__all__ = ["HEADER_LENGTH", "decode_infer_request", "encode_infer_response"]

HEADER_LENGTH = "inference-header-content-length"


def decode_infer_request(
    body: bytes, header_length: str | None, model: str, version: int | None, shared: SharedRead | None = None,
) -> tuple[InferRequest, dict[str, bool]]:
    """The request, and per output whether it is wanted as binary data (inputs in shared memory
    read through `shared`)."""
    binary = b""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise V2Error(f"Inference-Header-Content-Length {header_length!r} is not a length within the "
                          f"{len(body)}-byte body")
        body, binary = body[: int(header_length)], body[int(header_length):]
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise V2Error(f"the request is not JSON ({exc}); send a V2 inference request") from None
    if not isinstance(doc, dict):
        raise V2Error('the request must be a JSON object: {"inputs": [...]}')
    parameters = parameters_of(doc, "the request")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise V2Error('"id" must be a string')
    inputs = decode_inputs(doc.get("inputs"), binary, shared)
    wanted = doc.get("outputs")
    names: list[str] | None = None
    as_binary: dict[str, bool] = {}
    default_binary = bool(parameters.get("binary_data_output", False))
    output_parameters: dict[str, dict[str, object]] = {}
    if wanted is not None:
        if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
            raise V2Error('"outputs" must be a list of {"name": ...} objects')
        names = [o["name"] for o in wanted]
        for o in wanted:
            params = parameters_of(o, f"output {o['name']}")
            shared_span(params, f"output {o['name']}")  # a malformed span fails before the model runs
            output_parameters[o["name"]] = params
            as_binary[o["name"]] = bool(params.get("binary_data", default_binary))
    request = InferRequest(model, version, inputs, request_id, parameters, names, output_parameters)
    request.parameters.setdefault("binary_data_output", default_binary)
    return request, as_binary


def encode_infer_response(
    response: InferResponse, as_binary: dict[str, bool], default_binary: bool,
    output_parameters: dict[str, dict[str, object]] | None = None, write: SharedWrite | None = None,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it (outputs
    asked for in shared memory written through `write`)."""
    wanted = {name: as_binary.get(name, default_binary) for name in response.outputs}
    outputs, written = encode_outputs(response.outputs, wanted, output_parameters, write)
    parts = [part for part in written if part is not None]
    doc: dict[str, object] = {"model_name": response.model, "model_version": str(response.version), "outputs": outputs}
    if response.id is not None:
        doc["id"] = response.id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not parts:
        return header, None
    return header + b"".join(parts), len(header)
