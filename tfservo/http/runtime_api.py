"""SageMaker's runtime API (`InvokeEndpoint`), the contract boto3, the AWS CLI and the SageMaker
SDK speak: POST /endpoints/{EndpointName}/invocations.

The container contract (`/invocations`) answers a model's error as it is; the runtime API
wraps it as botocore's `ModelError` (424, with the original status and message) and answers
its own checks as `ValidationError` (400), so client code's `except` clauses see what they
see against SageMaker. This module holds those rules and shapes; the HTTP route only maps them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from tfservo.auth.access import Throttled
from tfservo.auth.keys import NotAllowed, Unauthenticated
from tfservo.auth.sigv4 import SignatureRefused
from tfservo.core.errors import InvalidArgument, NotFound, ServingError
from tfservo.service.invocation import InvocationResult, NotRoutable, error_result

__all__ = [
    "DEFAULT_VARIANT",
    "RuntimeError_",
    "RuntimeValidationError",
    "RuntimeRequest",
    "check_request",
    "model_error",
    "runtime_error",
]

DEFAULT_VARIANT = "AllTraffic"  # the variant name the SageMaker SDK gives a deployed model

_ENDPOINT_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
_PRINTABLE_ID = re.compile(r"\S[\x20-\x7e]*")


class RuntimeValidationError(InvalidArgument):
    """A request the runtime API itself refuses: botocore's ValidationError (400, runtime_error)."""


@dataclass(frozen=True)
class RuntimeRequest:
    """The runtime API's view of one InvokeEndpoint call, its headers checked."""

    endpoint_name: str
    target_variant: str | None  # TargetVariant, checked; None: drawn by weight
    target_model: str | None = None
    inference_id: str | None = None


@dataclass(frozen=True)
class RuntimeError_:
    """An answer in the runtime API's error shape: status, botocore error type, JSON body."""

    status: int
    error_type: str
    body: bytes
    retry_after: float | None = None


def check_request(
    endpoint_name: str,
    *,
    served_endpoint: str | None,
    variants: Sequence[str],
    target_variant: str | None,
    target_model: str | None,
    inference_id: str | None,
    custom_attributes: str | None,
) -> RuntimeRequest:
    """Check an InvokeEndpoint call as SageMaker does; RuntimeValidationError naming the field."""
    if not _ENDPOINT_NAME.fullmatch(endpoint_name):
        raise RuntimeValidationError(
            f"1 validation error detected: Value '{endpoint_name[:100]}' at 'endpointName' failed to satisfy "
            "constraint: Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9])* "
            "and have length less than or equal to 63"
        )
    if served_endpoint is not None and endpoint_name != served_endpoint:
        raise RuntimeValidationError(
            f"Endpoint {endpoint_name} not found: this server is endpoint {served_endpoint} "
            "(tfservo serve --endpoint-name)"
        )
    if target_variant is not None and target_variant not in variants:
        has = f"it has {variants[0]} only" if len(variants) == 1 else f"its variants are {', '.join(variants)}"
        raise RuntimeValidationError(f"The variant {target_variant} is not found for endpoint {endpoint_name}: {has}")
    if inference_id is not None and (len(inference_id) > 64 or not _PRINTABLE_ID.fullmatch(inference_id)):
        raise RuntimeValidationError(
            f"1 validation error detected: Value at 'inferenceId' failed to satisfy constraint: 1 to 64 "
            f"printable characters, not starting with a space (got {inference_id[:80]!r})"
        )
    if custom_attributes is not None and (len(custom_attributes) > 1024 or not custom_attributes.isascii()):
        raise RuntimeValidationError(
            "1 validation error detected: Value at 'customAttributes' failed to satisfy constraint: "
            "at most 1024 ASCII characters"
        )
    return RuntimeRequest(endpoint_name, target_variant, target_model, inference_id)


def model_error(result: InvocationResult, endpoint_name: str) -> RuntimeError_:
    """A model's (or handler's) error answer as botocore's ModelError: 424, the original status
    code and message kept (from the container that failed, in a pipeline). The endpoint's own
    refusal to route the request (TargetVariant, TargetContainerHostname) is a ValidationError."""
    if isinstance(result.error, NotRoutable):
        return runtime_error(result.error)
    original = result.body.decode("utf-8", "replace")
    kind = "client" if result.status < 500 else "server"
    doc = {
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "message": (
            f'Received {kind} error ({result.status}) from {result.container or "primary"} with message "{original}". '
            f"See the tfservo serve log of endpoint {endpoint_name} for more information."
        ),
        "OriginalStatusCode": result.status,
        "OriginalMessage": original,
    }
    return RuntimeError_(424, "ModelError", orjson.dumps(doc))


def runtime_error(exc: ServingError) -> RuntimeError_:
    """A failure before the model answered, as the runtime API's own error."""
    if isinstance(exc, SignatureRefused):  # AWS's own codes: botocore raises them as ClientError
        return RuntimeError_(exc.aws_status, exc.error_type, orjson.dumps({"message": exc.message}), exc.retry_after)
    if isinstance(exc, Throttled):  # too many failed signatures from this peer
        return RuntimeError_(429, "ThrottlingException", orjson.dumps({"message": exc.message}), exc.retry_after)
    if isinstance(exc, (Unauthenticated, NotAllowed)):  # --api-keys: AWS's words for a refused caller
        kind = ("MissingAuthenticationTokenException" if isinstance(exc, Unauthenticated) and exc.missing
                else "UnrecognizedClientException" if isinstance(exc, Unauthenticated) else "AccessDeniedException")
        return RuntimeError_(403, kind, orjson.dumps({"message": exc.message}))
    status = error_result(exc).status
    if isinstance(exc, (InvalidArgument, NotFound)) or 400 <= status < 500:
        return RuntimeError_(400, "ValidationError", orjson.dumps({"message": exc.message}))
    if status in (504, 507):  # a timeout, a target model that does not fit: SageMaker's ModelError
        doc = {"message": exc.message, "OriginalStatusCode": status, "OriginalMessage": exc.message}
        return RuntimeError_(424, "ModelError", orjson.dumps(doc))
    if status == 503:
        return RuntimeError_(503, "ServiceUnavailable", orjson.dumps({"message": exc.message}), exc.retry_after)
    return RuntimeError_(500, "InternalFailure", orjson.dumps({"message": exc.message}))
