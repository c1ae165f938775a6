"""Spark: a bundle in a pandas UDF (`df.withColumn`) or in `df.mapInPandas`, loaded once per
Python worker (Spark reuses them), in the manner of `pyspark.ml.functions.predict_batch_udf`.

    from tfservo.spark import bundle_predict_udf, bundle_predict_frames

    y = bundle_predict_udf("model.tar.gz", output="y", return_type="double")
    df.withColumn("y", y("x"))                      # columns in the signature's input order
    df.mapInPandas(bundle_predict_frames("model.tar.gz"), "id string, x double, y double")

The same inputs and outputs as tfservo.ray.BundlePredictor (batch/worker/columns.py): signature
inputs by column name, `body` with `content_type=`, `on_error="column"` for an `error` column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfservo.batch.worker.columns import ColumnPredictor
from tfservo.batch.worker.once import load_once
from tfservo.core.extras import require
from tfservo.core.logs import quiet_libraries

if TYPE_CHECKING:
    import pandas as pd

require("tfservo.spark", "spark", "pyspark")

__all__ = ["bundle_predict_frames", "bundle_predict_udf"]



def _predictor(bundle: str, selection: dict[str, Any]) -> ColumnPredictor:
    """The bundle loaded once in this Python worker for these arguments."""
    def load() -> ColumnPredictor:
        quiet_libraries()
        return ColumnPredictor(bundle, **selection)

    return load_once(("columns", bundle, tuple(sorted(selection.items()))), load)


def bundle_predict_frames(bundle: str, **selection: object) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A function for `df.mapInPandas(fn, schema)`: each pandas DataFrame of the partition gets
    its prediction columns (other columns kept); `schema` names the columns it returns."""

    def frames(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        predict = _predictor(bundle, selection)
        for frame in batches:
            out = predict({name: frame[name].to_numpy() for name in frame.columns})
            yield pd.DataFrame({name: _cells(values) for name, values in out.items()})

    return frames


def bundle_predict_udf(
    bundle: str, *, return_type: Any, output: str | None = None, input_names: Sequence[str] | None = None,
    **selection: object,
) -> Any:  # pyspark's UserDefinedFunctionLike
    """A pandas UDF: `udf(col, ...)` → one prediction column.

    The columns passed are the signature's inputs in `input_names` order (default: its one
    input), or the raw `body` with content_type=; `output` picks the output to return (default:
    the only one, `response` for raw bodies). `return_type` is the Spark type of that column,
    e.g. "double" or "array<float>". With on_error="column" a failed row's value is null.
    """
    import warnings

    from pyspark.sql.pandas.functions import PandasUDFType, pandas_udf

    def predict(*series: Any) -> Any:
        import pandas as pd

        predictor = _predictor(bundle, selection)
        names = list(input_names) if input_names else _default_inputs(predictor, len(series))
        out = predictor({name: s.to_numpy() for name, s in zip(names, series)})
        chosen = output or _only_output(predictor, out)
        return pd.Series(_cells(out[chosen]))

    with warnings.catch_warnings():  # the explicit type (its hints are strings here) is "deprecated"
        warnings.simplefilter("ignore", UserWarning)
        return pandas_udf(predict, returnType=return_type, functionType=PandasUDFType.SCALAR)


def _default_inputs(predictor: ColumnPredictor, given: int) -> list[str]:
    names = predictor.input_columns()
    if len(names) != given:
        raise ValueError(f"{predictor.target.describe()} takes {', '.join(names)}; the UDF got {given} columns: pass "
                         "input_names= naming the input each column is")
    return names


def _only_output(predictor: ColumnPredictor, out: dict[str, object]) -> str:
    from tfservo.batch.worker.columns import ERROR_COLUMN

    names = predictor.output_columns()
    if len(names) != 1:
        raise ValueError(f"{predictor.target.describe()} has outputs {', '.join(names)}; pass output= one of them "
                         f"(or use bundle_predict_frames for all{', and ' + ERROR_COLUMN if ERROR_COLUMN in out else ''})")
    return names[0]


def _cells(values: object) -> object:
    """A column for pandas: 1-D arrays as they are, higher ranks as one list per row."""
    if isinstance(values, np.ndarray) and values.ndim > 1:
        return list(values.tolist())
    return values
