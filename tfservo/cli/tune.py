"""`tfservo tune BUNDLE`: measure settings on this machine and write the best for `serve --config`."""

from __future__ import annotations

import re
import sys

import click

__all__ = ["tune"]

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


def _duration(value: str, default_unit: str) -> float:
    """Seconds of '50ms', '2s', '5m', '1h' (a bare number is in `default_unit`)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not a duration; write e.g. 50ms, 2s, 5m")
    return float(match.group(1)) * _UNITS[match.group(2) or default_unit]


@click.command()
@click.argument("bundle", metavar="BUNDLE")
@click.option("--p99", "p99", default="100ms", show_default=True, help="The latency target: p99 of each load level.")
@click.option("--budget", default="5m", show_default=True, help="The most time the search takes (e.g. 90s, 5m).")
@click.option("--requests", "requests_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A file holding one request body, sent to /invocations as a client sends it (through the "
              "bundle's handlers); without it, rows are generated from the model's signature and sent over "
              "TF Serving's JSON, V2's binary tensors and gRPC.")
@click.option("--content-type", default="application/json", show_default=True, help="The --requests file's type.")
@click.option("--accept", default=None, help="The Accept header sent with --requests.")
@click.option("--rows", default=1, show_default=True, type=click.IntRange(1, 100_000),
              help="Rows in each generated request.")
@click.option("--model", default=None, help="The model generated requests go to [default: the one serve answers with].")
@click.option("--protocol", "protocols", multiple=True, type=click.Choice(["tfs-json", "v2-binary", "grpc"]),
              help="Measure only these protocols (repeatable) [default: all three].")
@click.option("--step", default="2s", show_default=True, help="How long each load level runs.")
@click.option("--max-workers", default=0, type=click.IntRange(0), help="The most workers tried [default: the cores].")
@click.option("--rate", default=None, type=click.FloatRange(0, min_open=True),
              help="A request rate (req/s) to size for: prints the instances it needs.")
@click.option("--emit", multiple=True, type=click.Choice(["k8s", "sagemaker"]),
              help="Also write scaling rules: k8s (a KEDA ScaledObject and an HPA), sagemaker "
              "(the InvocationsPerInstance policy). Repeatable.")
@click.option("--out", "out_dir", default="tune-results", show_default=True, type=click.Path(file_okay=False),
              help="Where tuned.toml, tune.json, tune.png, servers.log and the scaling rules go.")
def tune(bundle: str, p99: str, budget: str, requests_file: str | None, content_type: str, accept: str | None,
         rows: int, model: str | None, protocols: tuple[str, ...], step: str, max_workers: int,
         rate: float | None, emit: tuple[str, ...], out_dir: str) -> None:
    """Measure how BUNDLE serves on this machine and write the settings that serve the most
    requests per second within the --p99 latency target.

    Starting from what `tfservo serve` picks here, it tries one setting at a time — workers,
    TensorFlow's threads, batching and its sizes, the protocol — each at rising numbers of
    clients, keeps a change only when it gains more than the noise it measured, and stops
    when a pass gains nothing or --budget is spent. Writes OUT/tuned.toml (serve it with
    `tfservo serve --config OUT/tuned.toml`), OUT/tune.json and OUT/tune.png, and prints the
    table, the per-instance concurrency and rate at the target, and with --rate the instances.
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.logs import setup_logging
    from tfservo.tune.report import summary_lines, table_lines, write_outputs
    from tfservo.tune.search import TuneOptions
    from tfservo.tune.search import tune as run_tune

    setup_logging("warning")
    options = TuneOptions(
        bundle=bundle, p99_ms=_duration(p99, "ms") * 1e3, budget_s=_duration(budget, "s"), out_dir=out_dir,
        requests_file=requests_file, content_type=content_type, accept=accept, rows=rows,
        step_s=_duration(step, "s"), protocols=protocols, max_workers=max_workers, model=model,
    )
    if options.budget_s < 6 * options.step_s + 20:
        raise click.BadParameter(f"{budget} leaves no room for a search with --step {step}: give at least "
                                 f"{6 * options.step_s + 20:.0f} s, or a shorter --step", param_hint="--budget")
    def progress(line: str) -> None:
        click.echo(line, err=True)

    try:
        result = run_tune(options, progress)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    except KeyboardInterrupt:
        sys.exit(130)
    written = write_outputs(result, emit, rate)
    click.echo("\n".join(table_lines(result)))
    click.echo("")
    click.echo("\n".join(summary_lines(result, rate)))
    for what, path in written.items():
        click.echo(f"{what}: {path}")
    if "plot" not in written:
        click.echo("plot: not drawn; matplotlib is not installed (pip install 'tfservo[evaluate]')")
    if "sagemaker" in written:
        with open(written["sagemaker"], encoding="utf-8") as f:
            click.echo("")
            click.echo(f.read().rstrip())
    if "config" not in written:
        sys.exit(1)
