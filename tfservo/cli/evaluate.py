"""`tfservo evaluate`: a transform's outputs against labels (the work is in tfservo.batch.evaluation)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

__all__ = ["evaluate"]


@click.command()
@click.argument("output")
@click.option("--labels", "labels_file", default=None, metavar="FILE",
              help="CSV `key,label` or JSON lines {\"key\": ..., \"label\": ...}; keys are input names "
              "(a/b.png, or just b.png) or record ids (name:N).")
@click.option("--label-from-name", default=None, metavar="REGEX",
              help="Take each label from the input's name: the regex's `label` group or its first, "
              "e.g. '([a-z]+)_\\d+\\.png$'.")
@click.option("--classes", default=None, metavar="A,B,...",
              help="Class names in the order of the model's scores (class ids are indexes into them); needed "
              "when labels are names and predictions are scores or ids, unless --model names them.")
@click.option("--model", "model_path", default=None, metavar="BUNDLE",
              help="Take the class names from the bundle's SavedModel: assets/labels.txt (or classes.txt, "
              "class_names.txt), one per line in the order of its outputs.")
@click.option("--task", type=click.Choice(["auto", "classification", "regression"]), default="auto",
              show_default=True, help="auto: regression when the labels are non-integer numbers.")
@click.option("--id-column", type=int, default=None, metavar="N",
              help="CSV outputs: column N (from 0) is the record's id (e.g. with --join-source Input).")
@click.option("--plot", "plot_path", default=None, metavar="PATH.png", help="Write the row-normalised confusion matrix.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write the metrics and problems as JSON.")
def evaluate(output: str, labels_file: str | None, label_from_name: str | None, classes: str | None, model_path: str | None,
             task: str, id_column: int | None, plot_path: str | None, json_path: str | None) -> None:
    """Score a transform's OUTPUT (a folder or s3:// prefix of .out files) against labels.

    Prints accuracy and per-class precision, recall, F1 and support (regression: MAE, RMSE, R²),
    and lists every output that could not be read and every record or label left unmatched.
    Exits 1 when no record could be evaluated.
    """
    import fsspec
    import orjson
    from tqdm import tqdm

    from tfservo.batch.evaluation import (
        OUT_SUFFIX,
        class_names_from_bundle,
        labels_from_file,
        labels_from_names,
        plot_confusion,
        read_outputs,
        table,
    )
    from tfservo.batch.evaluation import evaluate as run_evaluation
    from tfservo.core.errors import ServingError
    from tfservo.core.extras import require

    try:
        require("tfservo evaluate", "evaluate", "sklearn")
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    if bool(labels_file) == bool(label_from_name):
        raise click.UsageError("give one of --labels FILE or --label-from-name REGEX")
    fs, root = fsspec.core.url_to_fs(output)
    if not fs.isdir(root):
        raise click.ClickException(f"{output} is not a folder or prefix of .out files")
    root = root.rstrip("/")
    paths = sorted(p for p in fs.find(root) if p.endswith(OUT_SUFFIX))
    if not paths:
        raise click.ClickException(f"no .out files under {output}; give the transform's OUTPUT")

    def files() -> Iterator[tuple[str, bytes]]:
        for path in tqdm(paths, desc="reading outputs", unit="file", disable=len(paths) < 200, file=sys.stderr):
            yield path[len(root) + 1:], fs.cat_file(path)

    def write(path: str, data: bytes) -> None:
        with fsspec.open(path, "wb") as f:
            f.write(data)

    try:
        records, unreadable = read_outputs(files(), id_column=id_column)
        if labels_file:
            try:
                with fsspec.open(labels_file, "rb") as f:
                    text = f.read().decode("utf-8")
            except FileNotFoundError:
                raise click.ClickException(f"--labels {labels_file}: no such file") from None
            labels = labels_from_file(text)
        else:
            assert label_from_name is not None  # one of the two, checked above
            labels, matched = labels_from_names([r.name for r in records], label_from_name)
            click.echo(f"--label-from-name {matched}", err=True)
        if classes and model_path:
            raise click.UsageError("give --classes or --model, not both")
        names = [c.strip() for c in classes.split(",")] if classes else None
        if model_path:
            names = class_names_from_bundle(model_path)
            click.echo(f"classes from {model_path}: {', '.join(names)}", err=True)
        result = run_evaluation(records, labels, classes=names, unreadable=unreadable,
                                task=None if task == "auto" else task)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(table(result))
    problems = [("output(s) could not be read", result.unreadable), ("record(s) have no label", result.unlabelled),
                ("label(s) have no record", result.unpredicted), ("prediction(s) could not be used", result.unusable)]
    for what, items in problems:
        if items:
            click.echo(f"\n{len(items)} {what}:", err=True)
            for item in items[:50]:
                click.echo(f"  {item}", err=True)
            if len(items) > 50:
                click.echo(f"  ... and {len(items) - 50} more (all in --json)", err=True)
    if plot_path and result.task == "classification" and result.matched:
        plot_confusion(result, plot_path, write)
        click.echo(f"\nconfusion matrix: {plot_path}")
    if json_path:
        write(json_path, orjson.dumps(result.as_json(), option=orjson.OPT_INDENT_2))
        click.echo(f"metrics: {json_path}")
    sys.exit(0 if result.matched else 1)
