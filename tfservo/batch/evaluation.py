"""`tfservo evaluate`: a transform's `.out` files against labels — accuracy, per-class
precision/recall/F1, a row-normalised confusion matrix (or MAE/RMSE/R² for regression).

Each `.out` holds the answers for one input object: TF Serving JSON (`{"predictions": [...]}`,
one entry per record), JSON lines or CSV (a line per record). A record is named by its input's
relative path (`a/b.png`, the `.out` suffix dropped) and, when the object holds several, by
`name:N` (N from 1). Its prediction is per-class scores (argmax), a class id or name, a
`{"classes": ..., "probabilities": ...}` object (the ResNet notebook's signature), or a number
(regression). Every output that cannot be read, record without a label and label without a
record is counted and listed: nothing is skipped silently.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfservo.core.errors import InvalidArgument
from tfservo.core.extras import require

__all__ = [
    "Evaluation",
    "Record",
    "evaluate",
    "labels_from_file",
    "labels_from_names",
    "read_outputs",
]

OUT_SUFFIX = ".out"


@dataclass(frozen=True)
class Record:
    """One record's prediction: its name and what the model answered for it."""

    name: str
    prediction: object


@dataclass
class Evaluation:
    """The metrics and everything that could not be evaluated."""

    task: str  # "classification" or "regression"
    matched: int
    metrics: dict[str, Any]
    classes: list[str] = field(default_factory=list)
    confusion: list[list[float]] = field(default_factory=list)  # rows: true class, normalised
    unreadable: list[str] = field(default_factory=list)  # "file: why"
    unlabelled: list[str] = field(default_factory=list)  # records with no label
    unpredicted: list[str] = field(default_factory=list)  # labels with no record
    unusable: list[str] = field(default_factory=list)  # "record: why" (a prediction that is not one)

    def as_json(self) -> dict[str, object]:
        return {
            "task": self.task, "matched": self.matched, "metrics": self.metrics, "classes": self.classes,
            "confusion_matrix_row_normalised": self.confusion,
            "problems": {"unreadable_outputs": self.unreadable, "records_without_label": self.unlabelled,
                         "labels_without_record": self.unpredicted, "unusable_predictions": self.unusable},
        }


# -- reading outputs ------------------------------------------------------------------------


def read_outputs(
    files: Iterable[tuple[str, bytes]], *, id_column: int | None = None
) -> tuple[list[Record], list[str]]:
    """(relative name, bytes) of each `.out` → its records, and "name: why" for unreadable ones."""
    records: list[Record] = []
    unreadable: list[str] = []
    for name, data in files:
        base = name[: -len(OUT_SUFFIX)] if name.endswith(OUT_SUFFIX) else name
        try:
            predictions = _parse_output(data, id_column)
        except ValueError as exc:
            unreadable.append(f"{name}: {exc}")
            continue
        if not predictions:
            unreadable.append(f"{name}: holds no prediction")
            continue
        for i, (key, prediction) in enumerate(predictions, start=1):
            label = key if key is not None else (base if len(predictions) == 1 else f"{base}:{i}")
            records.append(Record(label, prediction))
    return records, unreadable


def _parse_output(data: bytes, id_column: int | None) -> list[tuple[str | None, object]]:
    text = data.decode("utf-8", errors="strict") if data else ""
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "{[":
        try:
            doc = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            doc = None  # maybe JSON lines
        if isinstance(doc, dict):
            if "predictions" in doc:
                return [(None, p) for p in _as_list(doc["predictions"])]
            if "outputs" in doc:
                return [(None, p) for p in _rows_of_outputs(doc["outputs"])]
            if "error" in doc:
                raise ValueError(f"the model answered an error: {str(doc['error'])[:200]}")
            return [(None, doc)]
        if doc is not None:
            return [(None, doc)]
        out: list[tuple[str | None, object]] = []
        for n, line in enumerate(stripped.splitlines(), start=1):
            if line.strip():
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ValueError(f"line {n} is not JSON ({exc})") from None
                if isinstance(value, dict) and "predictions" in value and len(_as_list(value["predictions"])) == 1:
                    value = _as_list(value["predictions"])[0]
                out.append((None, value))
        return out
    rows = [row for row in csv.reader(io.StringIO(stripped)) if row]
    out = []
    for n, row in enumerate(rows, start=1):
        key = None
        if id_column is not None:
            if id_column >= len(row):
                raise ValueError(f"line {n} has no column {id_column} (--id-column)")
            key = row[id_column]
            row = row[:id_column] + row[id_column + 1:]
        try:
            values = [float(v) for v in row]
        except ValueError:
            raise ValueError(f"line {n} is not numbers: {','.join(row)[:100]!r}") from None
        out.append((key, values[0] if len(values) == 1 else values))
    return out


def _as_list(value: object) -> list[object]:
    return value if isinstance(value, list) else [value]


def _rows_of_outputs(outputs: object) -> list[object]:
    """TF Serving's columnar answer → one prediction per row."""
    if not isinstance(outputs, dict):
        return _as_list(outputs)
    columns = {k: _as_list(v) for k, v in outputs.items()}
    length = min(len(v) for v in columns.values()) if columns else 0
    return [{k: v[i] for k, v in columns.items()} for i in range(length)]


# -- labels -----------------------------------------------------------------------------------


def labels_from_file(text: str) -> dict[str, str]:
    """CSV `key,label` rows (a header naming the columns is skipped) or JSON lines
    `{"key"|"id"|"name": ..., "label": ...}` → {key: label}."""
    labels: dict[str, str] = {}
    stripped = text.lstrip()
    if stripped.startswith("{"):
        for n, line in enumerate(stripped.splitlines(), start=1):
            if not line.strip():
                continue
            doc = orjson.loads(line)
            key = next((doc[k] for k in ("key", "id", "name", "source") if k in doc), None)
            if key is None or "label" not in doc:
                raise InvalidArgument(f"labels line {n} needs a key (key, id or name) and a label: {line[:100]}")
            labels[str(key)] = str(doc["label"])
        return labels
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row:
            continue
        if len(row) < 2:
            raise InvalidArgument(f"labels line {n} needs two columns, key and label: {','.join(row)[:100]}")
        if n == 1 and row[0].strip().lower() in ("key", "id", "name", "file", "source"):
            continue
        labels[row[0].strip()] = row[1].strip()
    return labels


def labels_from_names(names: Iterable[str], pattern: str) -> tuple[dict[str, str], str]:
    """The label of each record name from `pattern` (its `label` group, else its first group),
    matched against the input's name (`a/cat_1.png`) or, failing that, the output file's
    (`a/cat_1.png.out`, as a notebook that lists the outputs matches them); with which of the
    two matched, for the report."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise InvalidArgument(f"--label-from-name {pattern!r} is not a regular expression: {exc}") from None
    if regex.groups == 0:
        raise InvalidArgument(f"--label-from-name {pattern!r} needs a group around the label, e.g. '(\\w+)_\\d+\\.png'")
    group: str | int = "label" if "label" in regex.groupindex else 1
    labels: dict[str, str] = {}
    by_output = 0
    for name in names:
        for candidate in (name, name.split(":", 1)[0] + OUT_SUFFIX):
            match = regex.search(candidate)
            if match and match.group(group) is not None:
                labels[name] = match.group(group)
                by_output += candidate != name
                break
    if not labels:
        return labels, "matched neither the input names (e.g. cat_1.png) nor the output file names (cat_1.png.out)"
    if by_output == len(labels):
        return labels, "matched the output file names (NAME.out)"
    if by_output:
        return labels, f"matched {len(labels) - by_output} input names and {by_output} output file names"
    return labels, "matched the input names"


_CLASS_FILES = ("labels.txt", "classes.txt", "class_names.txt")


def class_names_from_bundle(path: str) -> list[str]:
    """The class names a bundle states: an `assets/labels.txt` (or classes.txt,
    class_names.txt; one name per line) of its SavedModel, the highest version's."""
    from pathlib import Path

    root = Path(path)
    if not root.is_dir():
        raise InvalidArgument(f"--model {path} is not a folder; give the bundle's (or SavedModel's) folder")
    found = sorted((f for name in _CLASS_FILES for f in root.rglob(f"assets/{name}")),
                   key=lambda f: [int(part) if part.isdigit() else -1 for part in f.parts])
    if not found:
        raise InvalidArgument(
            f"--model {path} names no classes: no assets/{', assets/'.join(_CLASS_FILES)} in it; "
            "give --classes in the order of the model's outputs"
        )
    names = [line.strip() for line in found[-1].read_text(encoding="utf-8").splitlines() if line.strip()]
    if not names:
        raise InvalidArgument(f"{found[-1]} is empty; it should name one class per line")
    return names


# -- evaluation ------------------------------------------------------------------------------


def evaluate(
    records: Sequence[Record],
    labels: Mapping[str, str],
    *,
    classes: Sequence[str] | None = None,
    unreadable: Sequence[str] = (),
    task: str | None = None,
) -> Evaluation:
    """Metrics over the records that have a label (keys matched exactly, else by the record's
    name without its folders)."""
    skm = require("tfservo evaluate", "evaluate", "sklearn.metrics")

    by_base: dict[str, str] = {}
    for key, label in labels.items():
        by_base.setdefault(key.rsplit("/", 1)[-1], label)
    pairs: list[tuple[Record, str]] = []
    unlabelled: list[str] = []
    used: set[str] = set()
    for record in records:
        key = record.name if record.name in labels else record.name.rsplit("/", 1)[-1]
        found = labels.get(record.name) or by_base.get(key)
        if found is None:
            unlabelled.append(record.name)
            continue
        used.add(record.name if record.name in labels else key)
        pairs.append((record, found))
    unpredicted = sorted(k for k in labels if k not in used and k.rsplit("/", 1)[-1] not in used)
    task = task or _task_of([label for _, label in pairs], classes)
    if task == "regression":
        truth, predicted, unusable = [], [], []
        for record, label in pairs:
            value = _number(record.prediction)
            if value is None or not _is_number(label):
                unusable.append(f"{record.name}: prediction {str(record.prediction)[:60]} / label {label!r}")
                continue
            truth.append(float(label))
            predicted.append(value)
        metrics: dict[str, object] = (
            {
                "mae": float(skm.mean_absolute_error(truth, predicted)),
                "rmse": float(math.sqrt(skm.mean_squared_error(truth, predicted))),
                "r2": float(skm.r2_score(truth, predicted)) if len(truth) > 1 else float("nan"),
            }
            if truth else {}
        )
        return Evaluation("regression", len(truth), metrics, unreadable=list(unreadable), unlabelled=unlabelled,
                          unpredicted=unpredicted, unusable=unusable)
    raw = [(record, label, _raw_class(record.prediction)) for record, label in pairs]
    names = list(classes) if classes else _class_names(raw)
    index = {name: i for i, name in enumerate(names)}
    y_true, y_pred, unusable = [], [], []
    for record, label, said in raw:
        true = _class_index(label, index, names)
        pred = _class_index(said, index, names) if said is not None else None
        if true is None or pred is None:
            why = "label" if true is None else "prediction"
            unusable.append(f"{record.name}: {why} {str(label if true is None else record.prediction)[:60]} "
                            f"is not one of the {len(names)} classes")
            continue
        y_true.append(true)
        y_pred.append(pred)
    if not y_true:
        return Evaluation("classification", 0, {}, names, [], list(unreadable), unlabelled, unpredicted, unusable)
    ids = list(range(len(names)))
    report = skm.classification_report(y_true, y_pred, labels=ids, target_names=names, output_dict=True,
                                       zero_division=0)
    matrix = skm.confusion_matrix(y_true, y_pred, labels=ids, normalize="true")
    confusion = [[0.0 if math.isnan(v) else float(v) for v in row] for row in matrix]
    metrics = {
        "accuracy": float(skm.accuracy_score(y_true, y_pred)),
        "per_class": {name: {k: float(v) for k, v in report[name].items()} for name in names},
        "macro_avg": {k: float(v) for k, v in report["macro avg"].items()},
        "weighted_avg": {k: float(v) for k, v in report["weighted avg"].items()},
    }
    return Evaluation("classification", len(y_true), metrics, names, confusion, list(unreadable), unlabelled,
                      unpredicted, unusable)


def _task_of(labels: Sequence[str], classes: Sequence[str] | None) -> str:
    if classes:
        return "classification"
    if labels and all(_is_number(v) for v in labels) and any(not float(v).is_integer() for v in labels):
        return "regression"
    return "classification"


def _natural(text: str) -> tuple[int, float | str]:
    return (0, float(text)) if _is_number(text) else (1, text)


def _is_number(text: Any) -> bool:
    try:
        float(text)
        return True
    except (TypeError, ValueError):
        return False


def _number(value: object) -> float | None:
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict) and len(value) == 1:
        return _number(next(iter(value.values())))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_integer(text: Any) -> bool:
    return _is_number(text) and float(text).is_integer()


def _class_index(label: object, index: Mapping[str, int], names: Sequence[str]) -> int | None:
    """A label or predicted class (a name, or an index into `names`) as an index into `names`."""
    if isinstance(label, int) and not isinstance(label, bool):
        return label if 0 <= label < len(names) else None
    text = str(label)
    if text in index:
        return index[text]
    if _is_number(text) and float(text).is_integer() and 0 <= int(float(text)) < len(names):
        return int(float(text))
    return None


def _raw_class(prediction: object) -> str | int | None:
    """What a prediction says the class is: a name (str) or an index into the model's classes
    (an id, or the argmax of scores); None when it says neither."""
    if isinstance(prediction, dict):
        for key in ("classes", "class_ids", "class"):
            if key in prediction:
                return _raw_class(prediction[key])
        for key in ("probabilities", "scores", "logits"):
            if key in prediction:
                return _argmax(prediction[key])
        if len(prediction) == 1:
            return _raw_class(next(iter(prediction.values())))
        return None
    if isinstance(prediction, list):
        if len(prediction) == 1:
            return _raw_class(prediction[0])
        return _argmax(prediction)
    if isinstance(prediction, bool):
        return None
    if isinstance(prediction, (int, float)):
        return int(prediction) if float(prediction).is_integer() else None
    return prediction if isinstance(prediction, str) else None


def _class_names(raw: Sequence[tuple[Record, str, str | int | None]]) -> list[str]:
    """The classes when --classes is not given, never guessed: integer labels are class ids
    (0..N-1); labels that are names need predictions that are names too, since an index (a
    class id, the argmax of scores) means nothing without the model's order of its classes."""
    labels = [label for _, label, _ in raw]
    if all(_is_integer(label) for label in labels):
        highest = max([int(float(label)) for label in labels] + [p for _, _, p in raw if isinstance(p, int)], default=0)
        return [str(i) for i in range(highest + 1)]
    indexed = next((record for record, _, predicted in raw if isinstance(predicted, int)), None)
    if indexed is not None:
        shown = ", ".join(sorted({str(label) for label in labels}, key=_natural)[:5])
        raise InvalidArgument(
            f"the labels are class names ({shown}, ...) but the predictions are scores or class ids "
            f"(e.g. {indexed.name}: {str(indexed.prediction)[:60]}), and the order of the model's classes is "
            "not known: give --classes with the names in the order of the model's outputs (e.g. --classes "
            "dog,cat,bird), or --model BUNDLE whose assets name its classes (labels.txt, one per line)"
        )
    named = {str(label) for label in labels} | {p for _, _, p in raw if isinstance(p, str)}
    return sorted(named, key=_natural)


def _argmax(values: object) -> int | None:
    flat = values
    while isinstance(flat, list) and len(flat) == 1 and isinstance(flat[0], list):
        flat = flat[0]
    if not isinstance(flat, list) or not flat or not all(_is_number(v) for v in flat):
        return None
    numbers = [float(v) for v in flat]
    return max(range(len(numbers)), key=numbers.__getitem__)


# -- reports -------------------------------------------------------------------------------------


def table(evaluation: Evaluation) -> str:
    """The metrics as a text table."""
    m = evaluation.metrics
    if evaluation.task == "regression":
        if not m:
            return "no record could be evaluated"
        return (f"records {evaluation.matched}\nMAE     {m['mae']:.6g}\nRMSE    {m['rmse']:.6g}\n"
                f"R²      {m['r2']:.6g}")
    if not m:
        return "no record could be evaluated"
    width = max([len(c) for c in evaluation.classes] + [12])
    lines = [f"accuracy {m['accuracy']:.4f} over {evaluation.matched} records", "",
             f"{'class':<{width}}  precision  recall  f1-score  support"]
    for name in evaluation.classes:
        row = m["per_class"][name]
        lines.append(f"{name:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1-score']:8.4f}  "
                     f"{int(row['support']):7d}")
    for key, title in (("macro_avg", "macro avg"), ("weighted_avg", "weighted avg")):
        row = m[key]
        lines.append(f"{title:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1-score']:8.4f}  "
                     f"{int(row['support']):7d}")
    return "\n".join(lines)


def plot_confusion(evaluation: Evaluation, path: str, write: Callable[[str, bytes], None]) -> None:
    """The row-normalised confusion matrix as a PNG with class names (matplotlib, Agg)."""
    matplotlib = require("tfservo evaluate --plot", "evaluate", "matplotlib")
    matplotlib.use("Agg")
    import numpy as np
    from matplotlib import pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    n = len(evaluation.classes)
    size = max(4.0, 0.6 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    display = ConfusionMatrixDisplay(np.array(evaluation.confusion), display_labels=evaluation.classes)
    display.plot(ax=ax, cmap="Blues", values_format=".2f", colorbar=True, xticks_rotation=45)
    ax.set_title(f"accuracy {evaluation.metrics.get('accuracy', 0):.3f} over {evaluation.matched} records "
                 "(rows normalised)")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    write(path, buffer.getvalue())
