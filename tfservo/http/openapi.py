"""OpenAPI 3.1 for every documented route of the route table (routes.ROUTES), with request and response schemas made per
served model from its signatures (input names, dtypes, shapes, an example): written at each
GET /openapi.json, so it follows models as they load and unload."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from tfservo.codecs.media_types import CONVERTIBLE_TYPES
from tfservo.codecs.v2 import V2_OF_TF
from tfservo.core.version import __version__
from tfservo.http.routes import ROUTES, Doc, RouteSpec
from tfservo.models.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    REGRESS_METHOD,
    SignatureDef,
    TensorSpec,
)

__all__ = ["openapi_document"]

_NUMBER = {"DT_FLOAT", "DT_DOUBLE", "DT_HALF", "DT_BFLOAT16"}
_INTEGER = {"DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_UINT16", "DT_UINT32", "DT_UINT64"}
_ERROR = {"description": "An error, as {\"error\": \"...\"}",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_JSON_ANY = {"content": {"application/json": {"schema": {"type": "object"}}}}


def _scalar(dtype: str) -> dict[str, object]:
    if dtype in _NUMBER:
        return {"type": "number"}
    if dtype in _INTEGER:
        return {"type": "integer"}
    if dtype == "DT_BOOL":
        return {"type": "boolean"}
    if dtype == "DT_STRING":
        return {"oneOf": [{"type": "string"},
                          {"type": "object", "properties": {"b64": {"type": "string"}}, "required": ["b64"]}]}
    return {}


def _tensor(spec: TensorSpec, *, drop_batch: bool) -> dict[str, object]:
    """Nested arrays for the spec's rank (the batch dimension dropped for one instance)."""
    schema = _scalar(spec.dtype)
    dims = list(spec.shape) if spec.shape is not None else None
    if dims is None:
        return {}  # unknown rank: any JSON value
    if drop_batch and dims:
        dims = dims[1:]
    for size in reversed(dims):
        schema = {"type": "array", "items": schema, **({"minItems": size, "maxItems": size} if size >= 0 else {})}
    return schema


def _example(spec: TensorSpec, *, drop_batch: bool) -> object:
    value: object = "" if spec.dtype == "DT_STRING" else (True if spec.dtype == "DT_BOOL" else 1.0)
    if spec.dtype in _INTEGER:
        value = 1
    dims = list(spec.shape or [])
    if drop_batch and dims:
        dims = dims[1:]
    for size in reversed(dims):
        value = [value] * (size if size > 0 else 1)
    return value


def _predict_body(sig: SignatureDef) -> dict[str, object]:
    inputs = sig.inputs
    if len(inputs) == 1:
        (spec,) = inputs.values()
        instance = _tensor(spec, drop_batch=True)
        example = {"instances": [_example(spec, drop_batch=True)]}
    else:
        instance = {"type": "object", "properties": {k: _tensor(s, drop_batch=True) for k, s in inputs.items()},
                    "required": sorted(inputs)}
        example = {"instances": [{k: _example(s, drop_batch=True) for k, s in inputs.items()}]}
    per_input = {k: _tensor(s, drop_batch=False) for k, s in inputs.items()}
    columnar: dict[str, object] = {"type": "object", "properties": per_input}
    schema = {
        "type": "object",
        "properties": {
            "signature_name": {"type": "string", "default": DEFAULT_SIGNATURE},
            "instances": {"type": "array", "items": instance},
            "inputs": columnar if len(inputs) > 1 else next(iter(per_input.values()), {}),
        },
        "oneOf": [{"required": ["instances"]}, {"required": ["inputs"]}],
    }
    return {"required": True, "content": {"application/json": {"schema": schema, "example": example}}}


def _v2_body(name: str, sig: SignatureDef) -> dict[str, object]:
    tensor = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": sorted(sig.inputs)},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": sorted({V2_OF_TF.get(s.dtype, s.dtype) for s in sig.inputs.values()})},
            "data": {},
            "parameters": {"type": "object"},
        },
        "required": ["name", "shape", "datatype"],
    }
    example = {"inputs": [
        {"name": k, "shape": [1, *[d if d > 0 else 1 for d in (s.shape or [])[1:]]],
         "datatype": V2_OF_TF.get(s.dtype, s.dtype), "data": [_example(s, drop_batch=True)]}
        for k, s in sorted(sig.inputs.items())
    ]}
    schema = {"type": "object", "properties": {"id": {"type": "string"}, "inputs": {"type": "array", "items": tensor},
                                               "outputs": {"type": "array"}, "parameters": {"type": "object"}},
              "required": ["inputs"]}
    return {"required": True, "content": {"application/json": {"schema": schema, "example": example}}}


def _op(summary: str, *, body: dict[str, object] | None = None, tags: list[str], ok: dict[str, object] | None = None,
        errors: tuple[int, ...] = (400, 404)) -> dict[str, object]:
    op: dict[str, Any] = {"summary": summary, "tags": tags,
                          "responses": {"200": ok or {"description": "OK", **_JSON_ANY}}}
    for status in errors:
        op["responses"][str(status)] = _ERROR
    if body is not None:
        op["requestBody"] = body
    return op


def _runtime_error(description: str, schema: str) -> dict[str, object]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _body(kind: str, name: str | None, sig: SignatureDef | None) -> dict[str, object]:
    """A request body of the shape a route's Doc names."""
    if kind == "predict" and sig is not None:
        return _predict_body(sig)
    if kind == "v2" and sig is not None and name is not None:
        return _v2_body(name, sig)
    if kind == "invocations":
        return {"required": True, "content": {t: {"schema": {}} for t in CONVERTIBLE_TYPES}}
    if kind == "load":
        return {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model_name", "url"],
            "properties": {"model_name": {"type": "string"}, "url": {"type": "string"}}}}}}
    if kind == "runtime":
        return {"required": True, "content": {"application/json": {"schema": {}}}}
    return {"required": True, **_JSON_ANY}


def _ok(kind: str) -> dict[str, object] | None:
    if kind == "empty":
        return {"description": "Healthy"}
    if kind == "text":
        return {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    if kind == "list":
        return {"description": "A JSON list", "content": {"application/json": {"schema": {"type": "array"}}}}
    if kind == "html":
        return {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}
    return None


def _operation(spec: RouteSpec, doc: Doc, name: str | None = None, sig: SignatureDef | None = None,
               summary: str | None = None) -> dict[str, object]:
    tags = [f"model {name}"] if name is not None else list(doc.tags)
    body = _body(doc.body, name, sig) if doc.body else None
    op = _op(summary or doc.summary.format(name=name), body=body, tags=tags, ok=_ok(doc.ok), errors=doc.errors)
    if doc.body == "runtime":  # the shapes botocore raises as ValidationError / ModelError
        op["responses"] = {"200": {"description": "OK", **_JSON_ANY},
                           "400": _runtime_error("ValidationError: the call itself is wrong", "RuntimeError"),
                           "424": _runtime_error("ModelError: the model answered 4xx/5xx", "ModelError")}
    if doc.body == "runtime_async":  # InvokeEndpointAsync: the request is in headers, the answer 202
        op["requestBody"] = {"required": False, "content": {"application/octet-stream": {"schema": {}}}}
        op["responses"] = {"202": {"description": "Queued: InferenceId in the body, X-Amzn-SageMaker-OutputLocation "
                                                  "and -FailureLocation in headers", **_JSON_ANY},
                           "400": _runtime_error("ValidationError: the call itself is wrong", "RuntimeError")}
    if name is None:  # the template's own parameters (per-model paths have theirs filled in)
        op["parameters"] = [_PATH_PARAMETERS.get(param, {"name": param, "in": "path", "required": True,
                                                         "schema": {"type": "string"}})
                            for param in re.findall(r"\{(\w+)\}", spec.name)]
    return op


_PATH_PARAMETERS = {
    "EndpointName": {"name": "EndpointName", "in": "path", "required": True,
                     "schema": {"type": "string", "pattern": "^[a-zA-Z0-9](-*[a-zA-Z0-9])*$", "maxLength": 63}},
}


def _tfs_methods(sig: SignatureDef) -> dict[str, tuple[str, str]]:
    """TF Serving's REST methods a default signature answers: method → (summary, body kind)."""
    methods = {"predict": (f"Predict with {{name}} ({sig.name})", "predict")}
    if sig.method_name in (CLASSIFY_METHOD, REGRESS_METHOD):
        method = "classify" if sig.method_name == CLASSIFY_METHOD else "regress"
        methods[method] = (f"{method.title()} tf.Examples with {{name}}", "json")
    return methods


def openapi_document(
    models: dict[str, SignatureDef | None], *, multi_model: bool = False, management: bool = True,
) -> dict[str, object]:
    """The document for `models` (name → its serving_default signature, None while unavailable),
    from the documented routes of routes.ROUTES (the management ones only while they answer)."""
    paths: dict[str, Any] = {}
    for spec in ROUTES:
        doc = spec.doc
        if doc is None or (spec.multi_model and not multi_model) or (spec.scope == "manage" and not management):
            continue
        verb = spec.methods[0].lower()
        if not doc.per_model:
            paths.setdefault(spec.name, {})[verb] = _operation(spec, doc)
            continue
        for name, sig in sorted(models.items()):
            if doc.needs is not None and sig is None:
                continue
            if doc.needs == "methods":
                assert sig is not None
                for method, (summary, body) in _tfs_methods(sig).items():
                    path = spec.name.format(name=name, method=method)
                    paths[path] = {verb: _operation(spec, replace(doc, body=body), name, sig, summary.format(name=name))}
                continue
            paths.setdefault(spec.name.format(name=name), {})[verb] = _operation(spec, doc, name, sig)
    return {
        "openapi": "3.1.0",
        "info": {"title": "tfservo", "version": __version__,
                 "description": "SageMaker's, TF Serving's and the Open Inference Protocol's REST APIs for the served models."},
        "paths": paths,
        "components": {"schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
            # the SageMaker runtime API's shapes, which botocore turns into ValidationError / ModelError
            "RuntimeError": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
            "ModelError": {"type": "object", "required": ["message", "OriginalStatusCode", "OriginalMessage"],
                           "properties": {"ErrorCode": {"type": "string"}, "message": {"type": "string"},
                                          "OriginalStatusCode": {"type": "integer"}, "OriginalMessage": {"type": "string"}}},
        }},
    }
