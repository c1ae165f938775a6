"""The workflow examples under examples/, run as the README says (small sizes), their real
outputs checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]


def run_example(name: str, *args: str, timeout: int = 900) -> str:
    done = subprocess.run([sys.executable, str(REPO / "examples" / name / "run.py"), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def test_insurance_ids_beside_predictions_as_endpoint_and_batch(tmp_path):
    out = run_example("insurance", "--quotes", "40", "--work", str(tmp_path))
    endpoint = out.split("== 1.")[1].split("== 2.")[0].strip().splitlines()[1:]
    assert len(endpoint) == 5
    for line in endpoint:
        quote_id, probability = line.split(",")
        assert quote_id.startswith("Q-") and 0.0 < float(probability) < 1.0
    assert any(ch in out for ch in "üøéèöñ")  # latin-1 names came through
    outputs = sorted((tmp_path / "out").glob("*.out"))
    assert [p.name for p in outputs] == [f"quotes-{i}.csv.out" for i in range(4)]
    records = [line for p in outputs for line in p.read_text(encoding="utf-8").splitlines()]
    sent = [line.split(";")[0] for p in sorted((tmp_path / "quotes").glob("*.csv"))
            for line in p.read_bytes().decode("latin-1").splitlines()]
    assert [r.split(",")[0] for r in records] == sent  # every id, in order, beside its prediction


def test_cifar10_trained_across_two_workers_transformed_and_evaluated(tmp_path):
    out = run_example("cifar10", "--train", "1000", "--test", "100", "--epochs", "4", "--work", str(tmp_path))
    assert "epoch 4/4" in out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["matched"] == 100 and not any(metrics["problems"].values())
    assert metrics["metrics"]["accuracy"] >= 0.6  # chance is 0.1
    rows = metrics["confusion_matrix_row_normalised"]
    assert len(rows) == 10 and all(len(r) == 10 and sum(r) == pytest.approx(1.0) for r in rows)
    with Image.open(tmp_path / "confusion_matrix.png") as image:
        assert image.format == "PNG"
    realtime = out.split("== 5.")[1].strip().splitlines()[1:]
    assert len(realtime) == 5 and all(re.match(r"\d{5}_[a-z]+\.png: ", line) for line in realtime), realtime
    notebooks_accuracy_and_confusion_cells(tmp_path / "out", tmp_path / "notebook_matrix.png")


def notebooks_accuracy_and_confusion_cells(out: Path, plot: Path) -> None:
    """What the CIFAR notebook does with a transform's outputs, step by step: each *.out file's
    `predictions` (a list of score lists) argmaxed to a label, the true label read from the file
    name by its regex `([a-zA-Z]+).png.out`, the accuracy, then a row-normalised crosstab drawn
    with seaborn's heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import pandas as pd
    import seaborn as sns

    labels = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    predicted, actual, correct = [], [], 0
    for entry in os.scandir(out):
        if entry.is_file() and entry.name.endswith("out"):
            with open(entry) as f:
                scores = [float(f"{item:.3f}") for row in json.load(f)["predictions"] for item in row]
            label = labels[int(np.argmax(np.array(scores)))]
            predicted.append(label)
            actual.append(re.search("([a-zA-Z]+).png.out", entry.name).group(1))  # None here was the bug
            correct += label in entry.name
    assert len(actual) == 100 and set(actual) <= set(labels)
    assert correct / len(actual) >= 0.6
    matrix = pd.crosstab(pd.Series(actual), pd.Series(predicted), rownames=["Actuals"], colnames=["Predictions"],
                         normalize="index")
    sns.heatmap(matrix, annot=True, fmt=".2f", cmap="YlGnBu").set_title("Confusion Matrix").figure.savefig(plot)
    assert plot.stat().st_size > 0


def test_resnet_jpeg_classes_and_probabilities_read_back(tmp_path):
    out = run_example("resnet_jpeg", "--images", "3", "--work", str(tmp_path))
    lines = out.split("== 3.")[1].strip().splitlines()[1:]
    assert len(lines) == 3
    for line in lines:
        assert ".jpg.out: class " in line and "1000 probabilities summing to 1.000" in line
    sizes = {p.name.split("-")[2].split(".")[0] for p in (tmp_path / "images").glob("*.jpg")}
    assert len(sizes) == 3  # JPEGs of varying sizes


def test_tfx_patterns_through_tfrecords(tmp_path):
    out = run_example("tfx_patterns", "--work", str(tmp_path))
    assert "[5 tfrecords] x=4 -> y=12 (half_plus_ten v1)" in out
    assert "[5 tfrecords] 5 PredictionLogs in" in out
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    [written] = tmp_path.glob("prediction_logs*.tfrecord")
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(written))]
    assert sorted(round(log.regress_log.response.result.regressions[0].value, 3) for log in logs) == [10.5, 11.0, 11.5, 12.0, 15.0]
    assert "[4c per key] fourth: 4.0 -> 40.0 (multiply_ten)" in out  # the four in-memory patterns too


def test_sagemaker_sdk_guide_requests(tmp_path, s3_endpoint):
    out = run_example("sagemaker_sdk", "--work", str(tmp_path))
    expected = {
        "TF Serving JSON": {"predictions": [3.5, 4.0, 5.5]},
        "simplified JSON": {"predictions": [3.5, 4.0, 5.5]},
        "JSON lines": {"predictions": [3.5, 4.0, 5.5]},
        "CSV": {"predictions": [3.5, 4.0, 5.5]},
        "second model by name": {"predictions": [2.5, 3.0, 4.5]},
        "classify": {"results": [[["y", 2.5]]]},
        "regress": {"results": [2.5, 3.0]},
        "AWS CLI, TF Serving JSON": {"predictions": [3.5, 4.0, 5.5]},
        "AWS CLI, model name and regress": {"results": [2.5]},
    }
    import ast

    seen = {line.split(": ", 1)[0]: ast.literal_eval(line.split(": ", 1)[1])
            for line in out.splitlines() if line.split(": ", 1)[0] in expected}
    assert seen == expected
