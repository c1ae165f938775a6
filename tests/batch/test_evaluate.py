"""`tfservo evaluate` on transform outputs with known answers: scores, class ids, the ResNet
notebook's classes/probabilities, JSON lines, CSV with ids, regression, labels from a file or
from names, and outputs that cannot be read or matched (counted and listed, never skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tfservo.batch.evaluation import Record, evaluate, labels_from_file, labels_from_names, read_outputs

TFSERVO = str(Path(sys.executable).with_name("tfservo"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TFSERVO, "evaluate", *args], capture_output=True, text=True, timeout=120)


def test_classification_from_names_with_a_plot_and_problems_listed(tmp_path):
    out = tmp_path / "out"
    (out / "test").mkdir(parents=True)
    # truth from the names: cat_1 cat_2 → cat, dog_1 dog_2 → dog, bird_1 → bird; cat_2 is guessed wrong
    guessed = {"cat_1.png": 0, "cat_2.png": 1, "dog_1.png": 1, "dog_2.png": 1, "bird_1.png": 2}
    for name, cls in guessed.items():
        scores = [0.1, 0.1, 0.1]
        scores[cls] = 0.8
        (out / "test" / f"{name}.out").write_text(json.dumps({"predictions": [scores]}))
    (out / "test" / "fish_1.png.out").write_text('{"error": "Failed to decode"}')  # unreadable
    (out / "test" / "broken.png.out").write_text("{not json")
    (out / "test" / "noname.png.out").write_text(json.dumps({"predictions": [[1, 0, 0]]}))  # no label
    done = run(str(out), "--label-from-name", r"([a-z]+)_\d+\.png$", "--classes", "cat,dog,bird",
               "--plot", str(tmp_path / "cm.png"), "--json", str(tmp_path / "m.json"))
    assert done.returncode == 0, done.stderr
    assert "accuracy 0.8000 over 5 records" in done.stdout
    assert "2 output(s) could not be read" in done.stderr and "fish_1.png.out: the model answered an error" in done.stderr
    assert "1 record(s) have no label" in done.stderr and "test/noname.png" in done.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["metrics"]["per_class"]["cat"]["recall"] == 0.5
    assert metrics["metrics"]["per_class"]["dog"]["precision"] == pytest.approx(2 / 3)
    rows = metrics["confusion_matrix_row_normalised"]
    assert len(rows) == 3 and all(sum(row) == pytest.approx(1.0) for row in rows)
    assert rows[0] == [0.5, 0.5, 0.0]
    with Image.open(tmp_path / "cm.png") as image:
        assert image.format == "PNG" and image.size[0] >= 400


def test_labels_file_jsonlines_outputs_record_ids_and_resnet_classes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "batch.jsonl.out").write_text("[0.9, 0.1]\n[0.2, 0.8]\n[0.6, 0.4]\n")
    (out / "resnet.jpg.out").write_text(json.dumps({"predictions": [{"classes": 1, "probabilities": [0.1, 0.9]}]}))
    labels = tmp_path / "labels.csv"
    labels.write_text("key,label\nbatch.jsonl:1,0\nbatch.jsonl:2,1\nbatch.jsonl:3,1\nresnet.jpg,1\nmissing.jpg,0\n")
    records, unreadable = read_outputs([(p.name, p.read_bytes()) for p in sorted(out.iterdir())])
    result = evaluate(records, labels_from_file(labels.read_text()), unreadable=unreadable)
    assert result.matched == 4 and result.metrics["accuracy"] == 0.75
    assert result.unpredicted == ["missing.jpg"]


def test_csv_outputs_with_ids_and_regression(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part.csv.out").write_text("q1,2.5\nq2,3.0\nq3,4.0\n")
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"id": "q1", "label": 2.5}\n{"id": "q2", "label": 3.5}\n{"id": "q3", "label": 4.0}\n')
    done = run(str(out), "--labels", str(labels), "--id-column", "0", "--json", str(tmp_path / "m.json"))
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["task"] == "regression" and metrics["matched"] == 3
    assert metrics["metrics"]["mae"] == pytest.approx(0.5 / 3)
    assert "RMSE" in done.stdout and "R²" in done.stdout


def test_nothing_matched_fails_and_bad_arguments_are_usage_errors(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.out").write_text('{"predictions": [[1, 0]]}')
    done = run(str(out), "--label-from-name", r"(zzz)")
    assert done.returncode == 1 and "no record could be evaluated" in done.stdout
    assert run(str(out)).returncode == 2  # neither --labels nor --label-from-name
    (tmp_path / "empty").mkdir()
    assert "no .out files" in run(str(tmp_path / "empty"), "--label-from-name", "(x)").stderr
    assert labels_from_names(["a/cat_1.png"], r"(?P<label>[a-z]+)_\d") == ({"a/cat_1.png": "cat"}, "matched the input names")


def dog_cat_bird(tmp_path: Path) -> Path:
    """A dog,cat,bird model's outputs, every one right: scores in the model's order dog, cat, bird."""
    out = tmp_path / "out"
    out.mkdir()
    for name, cls in {"dog_1.png": 0, "cat_1.png": 1, "bird_1.png": 2}.items():
        scores = [0.1, 0.1, 0.1]
        scores[cls] = 0.8
        (out / f"{name}.out").write_text(json.dumps({"predictions": [scores]}))
    return out


def test_the_class_order_is_never_guessed(tmp_path):
    out = dog_cat_bird(tmp_path)
    # names as labels, scores as predictions, no --classes: refused (alphabetical order would score 0.33)
    done = run(str(out), "--label-from-name", r"([a-z]+)_\d+\.png$")
    assert done.returncode == 1 and "the order of the model's classes is not known: give --classes" in done.stderr
    done = run(str(out), "--label-from-name", r"([a-z]+)_\d+\.png$", "--classes", "dog,cat,bird")
    assert done.returncode == 0 and "accuracy 1.0000 over 3 records" in done.stdout
    # the bundle names its classes: assets/labels.txt of its highest version
    for version, order in (("1", "bird\ncat\ndog\n"), ("2", "dog\ncat\nbird\n")):
        (tmp_path / "bundle" / "m" / version / "assets").mkdir(parents=True)
        (tmp_path / "bundle" / "m" / version / "assets" / "labels.txt").write_text(order)
    done = run(str(out), "--label-from-name", r"([a-z]+)_\d+\.png$", "--model", str(tmp_path / "bundle"))
    assert done.returncode == 0 and "accuracy 1.0000 over 3 records" in done.stdout
    assert "classes from" in done.stderr and "dog, cat, bird" in done.stderr
    done = run(str(out), "--label-from-name", r"([a-z]+)_\d+\.png$", "--model", str(tmp_path / "out"))
    assert done.returncode == 1 and "names no classes" in done.stderr
    # class ids as labels need no names; names as predictions need no order
    records = [Record("a", [0.9, 0.1, 0.0]), Record("b", 2), Record("c", {"classes": "cat", "probabilities": [1]})]
    assert evaluate(records[:2], {"a": "0", "b": "2"}).metrics["accuracy"] == 1.0
    assert evaluate(records[2:], {"c": "cat"}).metrics["accuracy"] == 1.0


def test_a_label_regex_written_for_the_output_files_matches_them(tmp_path):
    out = dog_cat_bird(tmp_path)
    done = run(str(out), "--label-from-name", r"([a-zA-Z]+)_\d.png.out", "--classes", "dog,cat,bird")
    assert done.returncode == 0 and "accuracy 1.0000 over 3 records" in done.stdout
    assert "--label-from-name matched the output file names (NAME.out)" in done.stderr
    done = run(str(out), "--label-from-name", r"(zzz)")
    assert "matched neither the input names" in done.stderr
