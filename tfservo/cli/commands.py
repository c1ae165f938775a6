"""The `tfservo` command: thin argument parsing over the parts that do the work."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from tfservo.core.logs import quiet_tensorflow, setup_logging
from tfservo.core.settings import GROUPS, options

if TYPE_CHECKING:
    from tfservo.core.settings import Settings
    from tfservo.service.factory import ModelService


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tfservo")
def main() -> None:
    """Serve, inspect, invoke and batch-transform SageMaker-style TensorFlow model bundles."""


def _setting_options(command: Callable[..., object]) -> Callable[..., object]:
    """One click option per declared setting that has flags (tfservo.core.settings): type, flags,
    help and choices come from the declaration. Every option defaults to None, "not given", so
    the environment and the declared default apply; a flag (bool) can only turn a setting on."""
    for option in reversed(options()):
        if not option.flags:
            continue
        kind: object = option.kind
        if option.existing_file:
            kind = click.Path(exists=True, dir_okay=False)
        elif option.choices:
            kind = click.Choice(option.choices)
        extra: dict[str, Any] = {"is_flag": True, "default": False} if option.kind is bool else {"type": kind, "default": None}
        if option.multiple:
            extra["multiple"], extra["default"] = True, ()
        command = click.option(*option.flags, option.name, help=option.help, metavar=option.metavar, **extra)(command)
    return command


class _GroupedHelp(click.Command):
    """A command whose --help lists its settings by concern (tfservo.core.settings.GROUPS), its
    other options after them."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        group_of = {option.name: option.group for option in options()}
        order = {name: i for group in GROUPS for i, name in enumerate(group.names)}
        sections: dict[str, list[tuple[int, tuple[str, str]]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                name = param.name or ""
                sections.setdefault(group_of.get(name, ""), []).append((order.get(name, len(order)), record))
        for title, key in [(group.title, group.key) for group in GROUPS] + [("Other options", "")]:
            if sections.get(key):
                with formatter.section(title):
                    formatter.write_dl([record for _, record in sorted(sections[key], key=lambda item: item[0])])


@main.command(cls=_GroupedHelp)
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option("--config", "config_file", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="Settings from a TOML, YAML or JSON file, by their flags' names without the dashes "
              "(workers = 2) or their variables' (SAGEMAKER_TFS_MAX_BATCH_SIZE = 16), and paths; flags given "
              "here win over the file, the file over the environment (what `tfservo tune` writes).")
@_setting_options
def serve(paths: tuple[str, ...], config_file: str | None, **flags: object) -> None:
    """Serve model bundles over SageMaker's /invocations and TF Serving's REST API.

    PATH is a model dir with numeric versions, a dir of several models, a model.tar.gz,
    a bare SavedModel dir or an s3:// URL to any of these [default: /opt/ml/model].
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.settings import resolve_settings
    from tfservo.server.run import serve as run_server

    given = {name: None if value is False or value == () else value for name, value in flags.items()}
    if config_file:
        paths = paths or _apply_config(config_file, given)
    settings = _settings(resolve_settings, paths=paths, **given)
    setup_logging(settings.log_level, settings.log_format, settings.access_log)
    try:
        _check_first(settings)
        run_server(settings)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None


@main.command()
@click.argument("path")
def inspect(path: str) -> None:
    """Print the models, versions and signatures of a bundle (like `saved_model_cli show --all`)."""
    from tfservo.cli.inspect import describe_bundle
    from tfservo.core.errors import ServingError
    from tfservo.core.settings import resolve_settings

    setup_logging("warning")
    settings = _settings(resolve_settings, paths=[path], multi_model=False, grpc_port=None, serving=False)
    try:
        _check_first(settings)
        click.echo(describe_bundle(settings))
    except ServingError as exc:
        raise click.ClickException(exc.message) from None


@main.command()
@click.argument("path")
@click.option("--content-type", "-t", default="application/json", show_default=True, help="Content type of the body on stdin.")
@click.option("--accept", "-a", default=None, help="Accept header [default: application/json].")
@click.option("--custom-attributes", "-c", default=None, help="X-Amzn-SageMaker-Custom-Attributes, e.g. 'tfs-method=regress'.")
@click.option("--model", "model_name", default=None, help="Model to invoke (as /models/NAME/invoke) [default: the default model].")
@click.option("--watch", is_flag=True, default=False,
              help="Keep the model loaded and run the same request again whenever code/inference.py, code/lib "
              "or a helper module changes (Ctrl-C to stop).")
@click.option("--reuse/--no-reuse", default=True, show_default=True,
              help="Send the request to a `tfservo serve` already serving PATH on this machine (started with "
              "--reload, or unchanged since it started) instead of loading the model here.")
def invoke(
    path: str, content_type: str, accept: str | None, custom_attributes: str | None, model_name: str | None,
    watch: bool, reuse: bool,
) -> None:
    """Run one /invocations request in-process on PATH, body from stdin, answer on stdout.

    The handler author's loop: no server to start, same conversions and inference.py calls;
    with --watch, edit the handler and see the new answer without loading the model again.
    With `tfservo serve PATH --reload` running, each invoke is answered by that server in a
    moment. Exits 1 (error JSON on stdout) when the invocation answers with an error status.
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.settings import resolve_settings

    setup_logging("info" if watch else "warning")
    body = sys.stdin.buffer.read()
    settings = _settings(resolve_settings, paths=[path], multi_model=False, serving=False)
    try:
        _check_first(settings)
        if reuse and not watch:
            from tfservo.cli.reuse import invoke_running

            answered = invoke_running(path, body, content_type, accept, custom_attributes, model_name)
            if answered is not None:
                click.echo(f"tfservo: answered by the server at {answered.server.url} (pid {answered.server.pid}; "
                           "--no-reuse loads the bundle here)", err=True)
                sys.exit(_write_answer(answered.body, answered.status < 400, answered.status))
        from tfservo.server.loopback import open_service  # TensorFlow, the model: seconds

        with open_service(settings) as service:
            def run() -> int:
                result = service.invoker.invoke(body, content_type, accept, custom_attributes, model_name)
                return _write_answer(result.body, result.ok, result.status)

            status = run()
            if watch:
                _watch_code(service, run)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    sys.exit(status)


def _write_answer(body: bytes, ok: bool, status: int) -> int:
    """An invocation's answer on stdout (ending in a line break); its exit status."""
    sys.stdout.buffer.write(body)
    if not body.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    if not ok:
        click.echo(f"tfservo: invocation failed with status {status}", err=True)
    return 0 if ok else 1


def _watch_code(service: ModelService, run: Callable[[], object]) -> None:
    """Run `run` again after each reload of the service's handler code, until Ctrl-C."""
    import threading

    from tfservo.server.reload import CodeReloader

    changed = threading.Event()
    reloader = CodeReloader(service, on_reload=lambda dirs: changed.set()).start()
    click.echo("tfservo: watching the handler code; edit it to run the request again (Ctrl-C stops)", err=True)
    try:
        while True:
            if changed.wait(0.5):
                changed.clear()
                run()
    except KeyboardInterrupt:
        pass
    finally:
        reloader.stop()


def _apply_config(path: str, given: dict[str, object]) -> tuple[str, ...]:
    """Fill the flags not `given` from the config file at `path` and export its variables (the
    file over the environment, the command line over both); the paths it names."""
    from tfservo.core.config_file import read_config_file
    from tfservo.core.environment import export
    from tfservo.core.settings import ConfigError

    try:
        config = read_config_file(path)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from None
    export(dict(config.env))
    for name, value in config.flags.items():
        if given.get(name) is None:
            given[name] = value
    return config.paths


def _check_first(settings: Settings) -> None:
    """The bundle's path, layout and handler code, checked before TensorFlow loads (preflight)."""
    from tfservo.service.preflight import check_bundles

    if settings.variants_file:  # every variant's bundles, a mistake named with its variant
        from tfservo.core.errors import BundleError
        from tfservo.core.variants_file import read_variants_file

        for variant in (*(endpoint := read_variants_file(settings.variants_file)).variants, *endpoint.shadows):
            try:
                check_bundles(variant.paths, settings.archive_limits, code_only=variant.pipeline is not None)
            except BundleError as exc:
                raise BundleError(f"--variants {settings.variants_file}: variant {variant.name}: {exc.message}") from None
        return
    check_bundles(settings.paths, settings.archive_limits, code_only=settings.pipeline)


def _settings(resolve: Callable[..., Settings], **flags: Any) -> Settings:
    """resolve(**flags), with a bad flag or environment variable reported as a usage error."""
    from tfservo.core.settings import ConfigError

    try:
        return resolve(**flags)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from None


from tfservo.cli.transform import transform  # noqa: E402  (kept in its own module: many flags)

main.add_command(transform)

from tfservo.cli.evaluate import evaluate  # noqa: E402

main.add_command(evaluate)

from tfservo.cli.keys import keys  # noqa: E402

main.add_command(keys)

from tfservo.cli.export import export  # noqa: E402

main.add_command(export)

from tfservo.cli.scan import scan  # noqa: E402
from tfservo.cli.sign import sign  # noqa: E402

main.add_command(scan)
main.add_command(sign)

from tfservo.cli.tune import tune  # noqa: E402

main.add_command(tune)

from tfservo.cli.compare import compare  # noqa: E402

main.add_command(compare)


def run() -> None:
    """The `tfservo` console script: TensorFlow's noise off before anything imports it, then the CLI."""
    quiet_tensorflow()
    main()


if __name__ == "__main__":
    run()
