"""`tfservo transform`: SageMaker batch transform job flags → a TransformJob → the local engine."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from tfservo.core.logs import setup_logging

if TYPE_CHECKING:
    from tfservo.batch.job import TransformJob
    from tfservo.batch.state import TransformSummary


class _AnyCase(click.Choice[str]):
    """A choice shown in SageMaker's spelling (Line, MultiRecord) that accepts any case."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        for choice in self.choices:
            if isinstance(value, str) and value.lower() == str(choice).lower():
                return choice
        return super().convert(value, param, ctx)


def _job_options(command: Callable[..., object]) -> Callable[..., object]:
    """One click option per declared job parameter (tfservo.batch.job): flag, type, default,
    help and choices come from the declaration."""
    from tfservo.batch.job import parameters

    for declared in reversed(parameters()):
        extra: dict[str, Any]
        if declared.kind is bool:
            extra = {"is_flag": True, "default": False}
        elif declared.kind is dict:
            extra = {"multiple": True, "default": ()}
        else:
            kind: Any = _AnyCase(list(declared.choices)) if declared.choices else declared.kind
            extra = {"type": kind, "default": declared.default, "show_default": bool(declared.default)}
        command = click.option(declared.flag, declared.name, help=declared.help, metavar=declared.metavar,
                               **extra)(command)
    return command


@click.command()
@click.argument("model")
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@_job_options
@click.option("--follow", is_flag=True, default=False,
              help="Keep watching INPUT and transform each new object as it lands (once it has stood still for "
              "a poll), until SIGINT or SIGTERM, which stop once the objects in flight are done; on the local engine or "
              "--runner ray.")
@click.option("--poll-seconds", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="With --follow: how often INPUT is listed.")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None, metavar="PORT",
              help="With --follow: Prometheus metrics (backlog, lag, objects, records) on "
              "http://127.0.0.1:PORT/metrics; 0 picks a free port (logged).")
@click.option("--progress", type=click.Choice(["auto", "bar", "log", "none"]), default="auto", show_default=True,
              help="auto: a progress bar on a terminal, a log line every 10 s otherwise. With --runner beam "
              "live only when the workers run in this process (DirectRunner, not multi_processing); "
              "Beam's counters are logged at the end.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log level on stderr.")
@click.option("--runner", type=click.Choice(["local", "beam", "ray", "spark"]), default="local", show_default=True,
              help="local: this machine's engine; beam, ray, spark: the same job on that engine's workers "
              "(same .out files; ray and spark start a local cluster unless given an address).")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Ray cluster for --runner ray, e.g. ray://head:10001 or auto [default: a local cluster on this "
              "machine's cores].")
@click.option("--spark-master", default=None, metavar="URL",
              help="Spark master for --runner spark, e.g. spark://host:7077, yarn, k8s://... [default: local[N], "
              "this machine's cores].")
@click.option("--workers", type=int, default=0, metavar="N",
              help="Model workers for --runner ray/spark, each holding the model once [default: one per core of "
              "the cluster]; on Ray each actor gets an equal share of the cluster's CPUs.")
@click.option("--beam-runner", default=None, metavar="NAME",
              help="Beam runner for --runner beam, e.g. DirectRunner, DataflowRunner, FlinkRunner, SparkRunner "
              "[default: DirectRunner].")
@click.option("--beam-option", "beam_options", multiple=True, metavar="KEY=VALUE",
              help="A Beam pipeline option for --runner beam (repeatable), e.g. direct_num_workers=2 or "
              "project=my-project.")
def transform(model: str, input_url: str, output_url: str, env: tuple[str, ...], follow: bool, poll_seconds: float,
              metrics_port: int | None, progress: str, log_level: str, runner: str, ray_address: str | None,
              spark_master: str | None, workers: int, beam_runner: str | None, beam_options: tuple[str, ...],
              **flags: Any) -> None:
    """Run a SageMaker-style batch transform of INPUT into OUTPUT on this machine.

    MODEL is any bundle `serve` accepts. INPUT and OUTPUT are local folders or fsspec URLs
    (s3://bucket/prefix/; S3-compatible stores via AWS_ENDPOINT_URL). Each input object
    gives OUTPUT/<its relative path>.out, which appears only when the whole object
    succeeded; rerunning the same command skips objects already done. Exits 1 when an
    object failed, after listing each with the record and error (also in the failure report,
    failures.json in the state location, which is <OUTPUT>.tfservo-state unless --state-dir).
    OUTPUT holds only .out files.
    """
    from tfservo.batch.engines.run import run_transform
    from tfservo.batch.job import JobError, TransformJob, parse_env
    from tfservo.core.errors import ServingError
    from tfservo.core.extras import MissingExtra
    from tfservo.storage.urls import UnsupportedStorage

    setup_logging(log_level)
    try:
        job = TransformJob(model=model, input=input_url, output=output_url, env=parse_env(env), **flags).validated()
    except JobError as exc:
        raise click.UsageError(exc.message) from None
    beam = None
    if runner == "beam":
        from tfservo.batch.engines.beam import BeamSettings

        beam = BeamSettings(beam_runner or "DirectRunner", list(beam_options))
        try:
            beam.flags()
        except (JobError, MissingExtra) as exc:
            raise click.UsageError(exc.message) from None
    elif beam_runner or beam_options:
        raise click.UsageError("--beam-runner and --beam-option need --runner beam")
    if ray_address and runner != "ray":
        raise click.UsageError("--ray-address needs --runner ray")
    if spark_master and runner != "spark":
        raise click.UsageError("--spark-master needs --runner spark")
    if workers and runner not in ("ray", "spark"):
        raise click.UsageError("--workers needs --runner ray or --runner spark")
    if workers < 0:
        raise click.UsageError("--workers must be 0 (one per core) or more")
    if follow and runner not in ("local", "ray"):
        raise click.UsageError("--follow runs on the local engine or on Ray; drop --runner or use --runner ray")
    if metrics_port is not None and not follow:
        raise click.UsageError("--metrics-port needs --follow (a batch run reports in its summary)")
    try:
        from tfservo.core.pipeline_file import container_paths
        from tfservo.service.preflight import check_bundles

        containers = container_paths(job.model)  # a pipeline file: its containers' bundles
        # before TensorFlow and any worker: a wrong bundle fails in a moment
        check_bundles(containers, code_only=len(containers) > 1)
        if follow:
            summary = _follow(job, poll_seconds, metrics_port, (ray_address, workers) if runner == "ray" else None)
        elif beam is not None:
            from tfservo.batch.engines.beam import run_beam_transform

            summary = run_beam_transform(job, beam, progress=progress)
        elif runner == "ray":
            from tfservo.batch.engines.ray import RaySettings, run_ray_transform

            summary = run_ray_transform(job, RaySettings(ray_address, workers), progress=progress)
        elif runner == "spark":
            from tfservo.batch.engines.spark import SparkSettings, run_spark_transform

            summary = run_spark_transform(job, SparkSettings(spark_master, workers), progress=progress)
        else:
            summary = run_transform(job, progress=progress)
    except (JobError, UnsupportedStorage) as exc:
        raise click.UsageError(exc.message) from None
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        click.echo("tfservo: interrupted; run the same command again to resume", err=True)
        sys.exit(130)
    for outcome in summary.failed:
        failure = outcome.failure
        click.echo(f"FAILED {outcome.obj.url}: {failure.where}: {failure.error}" if failure else
                   f"FAILED {outcome.obj.url}", err=True)
        if failure and failure.record is not None:
            click.echo(f"    record: {failure.record}", err=True)
    for outcome in summary.dead_lettered:
        click.echo(f"skipped {outcome.dead_letters} bad records of {outcome.obj.url} (see its .deadletter.jsonl)", err=True)
    click.echo(f"tfservo transform: {summary.line()}", err=True)
    if summary.report:
        click.echo(f"failure report: {summary.report}", err=True)
    if not summary.ok:
        sys.exit(1)


def _follow(job: TransformJob, poll_seconds: float, metrics_port: int | None,
            ray: tuple[str | None, int] | None) -> TransformSummary:
    """--follow until SIGINT or SIGTERM, which let the pass in flight finish its objects; with
    `ray` (--ray-address, --workers), each pass on Ray."""
    import signal
    import threading

    from tfservo.batch.engines.follow import FollowMetrics, follow_transform

    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():  # a second signal: stop now, as a plain run would
            raise KeyboardInterrupt
        click.echo("tfservo transform: stopping once the objects in flight are done (again to stop now)", err=True)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopping)
    if ray is not None:
        from tfservo.batch.engines.ray import RayPasses, RaySettings

        settings = RaySettings(*ray)
        return follow_transform(job, stop, poll_seconds=poll_seconds, metrics=FollowMetrics(metrics_port),
                                passes=lambda job: RayPasses(job, settings))
    return follow_transform(job, stop, poll_seconds=poll_seconds, metrics=FollowMetrics(metrics_port))
