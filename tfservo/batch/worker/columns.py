"""Columns in, prediction columns out: the one batch step of the columnar adapters (Ray Data's
`map_batches`, Spark's pandas UDFs and `mapInPandas`).

A batch is a dict of column name → array, one row per element. Columns named after the
signature's inputs are its inputs (predict), `examples` holds tf.Examples or their bytes
(classify/regress), and with a content type the `body` column holds raw request bodies run
through the bundle's /invocations path (inference.py and all). Every other column (keys) is
passed through beside the prediction columns. A row that fails is retried alone; its error goes
in the `error` column (on_error="column") or is raised naming the rows (on_error="raise").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfservo.batch.worker.batches import run_batch
from tfservo.batch.worker.failures import ElementErrors, ElementFailure
from tfservo.batch.worker.loaded import LoadedBundle, Selection
from tfservo.batch.worker.target import INVOKE, Target
from tfservo.core.errors import InvalidArgument

__all__ = ["BODY_COLUMN", "ERROR_COLUMN", "EXAMPLES_COLUMN", "ColumnPredictor"]

BODY_COLUMN = "body"
EXAMPLES_COLUMN = "examples"
ERROR_COLUMN = "error"
_ON_ERROR = ("raise", "column")
# The methods whose columns are not the signature's: (input column, what it holds), outputs.
_INPUT_COLUMNS = {INVOKE: (BODY_COLUMN, "raw request bodies"), "classify": (EXAMPLES_COLUMN, "tf.Examples or their bytes"),
                  "regress": (EXAMPLES_COLUMN, "tf.Examples or their bytes")}
_OUTPUT_COLUMNS = {INVOKE: ("response",), "classify": ("classes", "scores"), "regress": ("value",)}


class ColumnPredictor:
    """A bundle loaded once (per Ray actor, per Spark Python worker) and its batch step."""

    def __init__(
        self,
        bundle: str,
        *,
        model_name: str | None = None,
        version: int | None = None,
        signature_name: str | None = None,
        method: str | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        on_error: str = "raise",
    ) -> None:
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error={on_error!r}: use 'raise' (fail the batch) or 'column' (an error column)")
        self.on_error = on_error
        self.bundle = LoadedBundle(
            bundle, Selection(model_name, version, signature_name, method, content_type, accept, custom_attributes)
        )
        self.target: Target = self.bundle.target()

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """One batch of columns → the same rows with their prediction columns (and `error`)."""
        columns = {name: np.asarray(values) if not isinstance(values, np.ndarray) else values
                   for name, values in batch.items()}
        rows = len(next(iter(columns.values()))) if columns else 0
        if rows == 0:
            return dict(columns)
        used, elements = self._elements(columns, rows)
        results = [r for part in run_batch(self.bundle, self.target, elements) for r in part.results]
        failures = [r for r in results if isinstance(r, ElementFailure)]
        if failures and self.on_error == "raise":
            raise ElementErrors(failures, rows, self.target.describe()) from failures[0].error
        out = {name: values for name, values in columns.items() if name not in used}
        out.update(self._prediction_columns(results))
        if self.on_error == "column":
            errors = np.empty(rows, dtype=object)
            for failure in failures:
                errors[failure.index] = f"{type(failure.error).__name__}: {failure.error}"
            out[ERROR_COLUMN] = errors
        return out

    # -- elements ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the bundle's loopback server and unload its models."""
        self.bundle.close()

    def input_columns(self) -> list[str]:
        """The columns a batch's elements come from (the signature's inputs for predict)."""
        fixed = _INPUT_COLUMNS.get(self.target.method)
        if fixed is not None:
            return [fixed[0]]
        assert self.target.signature is not None
        return sorted(self.target.signature.inputs)

    def output_columns(self) -> list[str]:
        """The prediction columns of the results (the signature's outputs for predict)."""
        fixed = _OUTPUT_COLUMNS.get(self.target.method)
        if fixed is not None:
            return list(fixed)
        return sorted(self.target.signature.outputs) if self.target.signature is not None else []

    def _elements(self, columns: dict[str, np.ndarray], rows: int) -> tuple[set[str], list[object]]:
        """(the columns used as inputs, one element per row)."""
        t = self.target
        names = self.input_columns()
        fixed = _INPUT_COLUMNS.get(t.method)
        if fixed is not None:
            return {names[0]}, list(self._column(columns, names[0], fixed[1]))
        missing = [n for n in names if n not in columns]
        if missing:
            raise InvalidArgument(
                f"{t.describe()} takes inputs {', '.join(names)}; the batch has no column {', '.join(missing)} "
                f"(its columns: {', '.join(columns)}); name the columns after the signature's inputs"
            )
        return set(names), [{n: columns[n][i] for n in names} for i in range(rows)]

    def _column(self, columns: dict[str, np.ndarray], name: str, what: str) -> np.ndarray:
        if name not in columns:
            raise InvalidArgument(
                f"{self.target.describe()} reads {what} from a column named {name!r}; the batch has "
                f"{', '.join(columns) or 'no columns'}"
            )
        return columns[name]

    def _prediction_columns(self, results: list[Any]) -> dict[str, np.ndarray]:
        """Per-row results → columns: the signature's outputs, `classes`/`scores`, `value` or
        `response`; a failed row's cells are None."""
        t = self.target
        names = self.output_columns()
        columns = {name: np.empty(len(results), dtype=object) for name in names}
        for i, result in enumerate(results):
            if isinstance(result, ElementFailure):
                continue
            if t.method == INVOKE:
                columns["response"][i] = result
            elif t.method == "classify":
                columns["classes"][i] = [label for label, _ in result]
                columns["scores"][i] = [score for _, score in result]
            elif t.method == "regress":
                columns["value"][i] = float(result)
            else:
                for name in names:
                    columns[name][i] = result[name]
        return {name: _tight(column) for name, column in columns.items()}


def _tight(column: np.ndarray) -> np.ndarray:
    """An object column of same-shaped numbers as one numeric array (rows on axis 0), so engines
    see a tensor column; anything else (strings, ragged, a failed row's None) stays objects."""
    if len(column) == 0 or any(v is None for v in column):
        return column
    first = np.asarray(column[0])
    if first.dtype.kind not in "biuf" or any(np.shape(v) != first.shape for v in column):
        return column
    return np.stack([np.asarray(v) for v in column])
