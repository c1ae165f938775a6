"""An endpoint's production variants over HTTP: their weights and instance counts now, and
UpdateEndpointWeightsAndCapacities (the body boto3's `sagemaker` client sends), which changes
them for every worker of the server at once (service.variants keeps them in a shared table).

A server of one bundle answers with its one variant, weight 1, and refuses an update naming
any other.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tfservo.core.errors import InvalidArgument, ServingError
from tfservo.http.responses import error_response, json_response
from tfservo.service.invocation import Invoker
from tfservo.service.variants import VariantInvoker

__all__ = ["VariantRoutes"]


class VariantRoutes:
    """GET /endpoint/variants and POST /endpoint/variants/weights."""

    def __init__(self, invoker: Invoker, variant_name: str) -> None:
        self.invoker = invoker if isinstance(invoker, VariantInvoker) else None
        self.variant_name = variant_name  # a server of one variant

    async def describe(self, request: Request) -> Response:
        return json_response(self._described())

    def _described(self) -> dict[str, Any]:
        if self.invoker is None:
            return {"ProductionVariants": [{"VariantName": self.variant_name, "CurrentWeight": 1.0,
                                            "CurrentInstanceCount": 1}], "ShadowProductionVariants": []}
        return {
            "ProductionVariants": [{"VariantName": name, "CurrentWeight": weight, "CurrentInstanceCount": instances}
                                   for name, (weight, instances) in self.invoker.weights.current().items()],
            "ShadowProductionVariants": [{"VariantName": name} for name in self.invoker.shadow_names],
        }

    async def update_weights(self, request: Request) -> Response:
        try:
            changes = _changes(await request.body())
            if self.invoker is None:
                unknown = sorted(set(changes) - {self.variant_name})
                if unknown:
                    raise InvalidArgument(f"The variant {unknown[0]} is not found for this endpoint: it has "
                                          f"{self.variant_name} only")
            else:
                self.invoker.weights.update(changes)
        except ServingError as exc:
            return error_response(exc)
        return json_response(self._described())


def _changes(body: bytes) -> dict[str, tuple[float | None, int | None]]:
    """{"DesiredWeightsAndCapacities": [{"VariantName", "DesiredWeight", "DesiredInstanceCount"}]}."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidArgument('the body must be JSON: {"DesiredWeightsAndCapacities": [{"VariantName": ..., '
                              '"DesiredWeight": ...}]}') from None
    entries = doc.get("DesiredWeightsAndCapacities") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument("DesiredWeightsAndCapacities must be a list of at least one variant")
    changes: dict[str, tuple[float | None, int | None]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("VariantName"), str):
            raise InvalidArgument("each of DesiredWeightsAndCapacities names its VariantName")
        weight, count = entry.get("DesiredWeight"), entry.get("DesiredInstanceCount")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))):
            raise InvalidArgument(f"DesiredWeight of {entry['VariantName']} must be a number")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise InvalidArgument(f"DesiredInstanceCount of {entry['VariantName']} must be a whole number")
        if weight is None and count is None:
            raise InvalidArgument(f"{entry['VariantName']}: give DesiredWeight or DesiredInstanceCount")
        changes[entry["VariantName"]] = (None if weight is None else float(weight), count)
    return changes
