"""The `tfservo` command: thin argument parsing over the parts that do the work."""

from __future__ import annotations

import sys

import click

from tfservo.core.logs import quiet_tensorflow, setup_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tfservo")
def main() -> None:
    """Serve, inspect, invoke and batch-transform SageMaker-style TensorFlow model bundles."""


@main.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option("--host", default=None, help="Address to listen on [default: 127.0.0.1; 0.0.0.0 under SageMaker].")
@click.option(
    "--port", type=int, default=None, help="HTTP port [default: $SAGEMAKER_BIND_TO_PORT or 8080]; 0 picks a free one."
)
@click.option("--grpc-port", type=int, default=None, help="TF Serving gRPC port [default: 9000]; 0 picks a free one.")
@click.option(
    "--version-label",
    "version_labels",
    multiple=True,
    metavar="MODEL:LABEL=VERSION",
    help="Name a version for /v1/models/MODEL/labels/LABEL (repeatable).",
)
@click.option(
    "--max-request-mb", type=float, default=None, help="Largest request body accepted, in MB [default: 100]; larger → 413."
)
@click.option(
    "--intra-op-threads",
    type=int,
    default=None,
    help="TF intra-op threads [default: $SAGEMAKER_TFS_INTRA_OP_PARALLELISM or TF's choice].",
)
@click.option(
    "--inter-op-threads",
    type=int,
    default=None,
    help="TF inter-op threads [default: $SAGEMAKER_TFS_INTER_OP_PARALLELISM or TF's choice].",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="Log level [default: info]; debug logs one line per request.",
)
@click.option(
    "--enable-batching",
    is_flag=True,
    default=False,
    help="Merge concurrent requests into one model call [default: $SAGEMAKER_TFS_ENABLE_BATCHING]; "
    "sizes from SAGEMAKER_TFS_MAX_BATCH_SIZE (8), SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS (1000), ...",
)
@click.option(
    "--batching-parameters-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TF Serving batching parameters (text proto: max_batch_size, batch_timeout_micros, "
    "num_batch_threads, max_enqueued_batches, allowed_batch_sizes); turns batching on.",
)
@click.option(
    "--batching-eager",
    is_flag=True,
    default=False,
    help="With batching on: run a batch as soon as a batch thread is free instead of waiting "
    "for the timeout [default: $TFSERVO_BATCHING_EAGER].",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Serving processes sharing the port, each with its own copy of the models "
    "[default: $SAGEMAKER_GUNICORN_WORKERS or 1].",
)
@click.option(
    "--multi-model",
    is_flag=True,
    default=False,
    help="SageMaker multi-model mode: start with no models; POST /models loads one from under "
    "--model-root [default: $SAGEMAKER_MULTI_MODEL=true].",
)
@click.option(
    "--model-root",
    default=None,
    metavar="DIR",
    help="Multi-model mode: the only dir models may be loaded from, or an s3:// prefix whose archives "
    "X-Amzn-SageMaker-Target-Model names [default: /opt/ml/models].",
)
@click.option(
    "--model-config-file",
    "--model_config_file",
    "model_config_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TF Serving's text ModelServerConfig: models, base paths, version policies and labels.",
)
@click.option(
    "--file-system-poll-wait-seconds",
    "--file_system_poll_wait_seconds",
    "file_system_poll_wait_seconds",
    type=float,
    default=None,
    help="Check model base paths for new or removed version dirs this often [default: 0, never].",
)
@click.option(
    "--reload",
    "reload_code",
    is_flag=True,
    default=False,
    help="Import code/inference.py, code/lib and the bundle's helper modules again when they change, "
    "without reloading the models (a handler that does not import is logged and the previous one kept).",
)
@click.option("--keep-alive-timeout", type=float, default=None,
              help="Close an idle keep-alive connection after this many seconds [default: 5].")
@click.option("--header-timeout", type=float, default=None,
              help="A request's headers must arrive within this many seconds of the connection or the "
              "previous answer, else 408 and the connection closes [default: 10].")
@click.option("--max-connections", type=int, default=None,
              help="Open connections per worker; past it a new one gets 503 and is closed "
              "[default: the process's file limit less 128].")
@click.option("--max-decoding-mb", type=float, default=None,
              help="Request bodies read and decoded at once, per worker, in MB; past it a request gets "
              "503 with Retry-After [default: an eighth of the memory available at start, shared by the workers].")
@click.option("--endpoint-name", default=None, metavar="NAME",
              help="SageMaker runtime API: answer POST /endpoints/NAME/invocations for this name only "
              "[default: $TFSERVO_ENDPOINT_NAME, else any name].")
@click.option("--variant-name", default=None, metavar="NAME",
              help="The production variant this server is, named in X-Amzn-Invoked-Production-Variant "
              "[default: $TFSERVO_VARIANT_NAME or AllTraffic].")
@click.option("--request-timeout", type=float, default=None, metavar="SECONDS",
              help="Limit for a TF Serving REST call; past it 504 [default: none].")
@click.option("--invocation-timeout", type=float, default=None, metavar="SECONDS",
              help="Limit for an invocation, handlers included; past it 504 "
              "[default: $SAGEMAKER_GUNICORN_TIMEOUT_SECONDS or none].")
@click.option("--monitoring-config-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TF Serving's MonitoringConfig: its Prometheus metric names at its path.")
@click.option("--ssl-config-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TF Serving's SSLConfig (server_key, server_cert, custom_ca, client_verify): TLS for gRPC.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="HTTPS on the HTTP port: the server certificate (PEM), with --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="HTTPS: the server's private key (PEM).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="HTTPS: clients must present a certificate signed by this CA (PEM).")
@click.option("--model-config-file-poll-wait-seconds", "model_config_poll_seconds", type=float, default=None,
              help="Re-read --model-config-file this often and apply changes [default: 0, never].")
def serve(
    paths,
    host,
    port,
    grpc_port,
    version_labels,
    max_request_mb,
    intra_op_threads,
    inter_op_threads,
    log_level,
    enable_batching,
    batching_parameters_file,
    batching_eager,
    workers,
    multi_model,
    model_root,
    model_config_file,
    file_system_poll_wait_seconds,
    reload_code,
    keep_alive_timeout,
    header_timeout,
    max_connections,
    max_decoding_mb,
    endpoint_name,
    variant_name,
    request_timeout,
    invocation_timeout,
    monitoring_config_file,
    ssl_config_file,
    tls_cert,
    tls_key,
    tls_ca,
    model_config_poll_seconds,
):
    """Serve model bundles over SageMaker's /invocations and TF Serving's REST API.

    PATH is a model dir with numeric versions, a dir of several models, a model.tar.gz,
    a bare SavedModel dir or an s3:// URL to any of these [default: /opt/ml/model].
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.settings import resolve_settings
    from tfservo.server.run import serve as run_server

    settings = _settings(
        resolve_settings,
        paths=paths,
        host=host,
        port=port,
        grpc_port=grpc_port,
        max_request_mb=max_request_mb,
        version_labels=version_labels,
        intra_op_threads=intra_op_threads,
        inter_op_threads=inter_op_threads,
        log_level=log_level,
        enable_batching=enable_batching,
        batching_parameters_file=batching_parameters_file,
        batching_eager=batching_eager,
        workers=workers,
        model_root=model_root,
        model_config_file=model_config_file,
        file_system_poll_wait_seconds=file_system_poll_wait_seconds,
        multi_model=multi_model or None,
        reload_code=reload_code,
        keep_alive_timeout=keep_alive_timeout,
        header_timeout=header_timeout,
        max_connections=max_connections,
        max_decoding_mb=max_decoding_mb,
        endpoint_name=endpoint_name,
        variant_name=variant_name,
        request_timeout=request_timeout,
        invocation_timeout=invocation_timeout,
        monitoring_config_file=monitoring_config_file,
        ssl_config_file=ssl_config_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        model_config_poll_seconds=model_config_poll_seconds,
    )
    setup_logging(settings.log_level)
    try:
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
    settings = _settings(resolve_settings, paths=[path], multi_model=False, grpc_port=None)
    try:
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
def invoke(
    path: str, content_type: str, accept: str | None, custom_attributes: str | None, model_name: str | None,
    watch: bool,
) -> None:
    """Run one /invocations request in-process on PATH, body from stdin, answer on stdout.

    The handler author's loop: no server to start, same conversions and inference.py calls;
    with --watch, edit the handler and see the new answer without loading the model again.
    Exits 1 (error JSON on stdout) when the invocation answers with an error status.
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.settings import resolve_settings
    from tfservo.server.loopback import open_service

    setup_logging("info" if watch else "warning")
    body = sys.stdin.buffer.read()
    settings = _settings(resolve_settings, paths=[path], multi_model=False)
    try:
        with open_service(settings) as service:
            def run() -> int:
                result = service.invoker.invoke(body, content_type, accept, custom_attributes, model_name)
                sys.stdout.buffer.write(result.body)
                if not result.body.endswith(b"\n"):
                    sys.stdout.buffer.write(b"\n")
                sys.stdout.flush()
                if not result.ok:
                    click.echo(f"tfservo: invocation failed with status {result.status}", err=True)
                return 0 if result.ok else 1

            status = run()
            if watch:
                _watch_code(service, run)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    sys.exit(status)


def _watch_code(service, run) -> None:
    """Run `run` again after each reload of the service's handler code, until Ctrl-C."""
    import threading

    from tfservo.handlers.reload import CodeReloader

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


def _settings(resolve, **flags):  # -> tfservo.core.settings.Settings
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


def run() -> None:
    """The `tfservo` console script: TensorFlow's noise off before anything imports it, then the CLI."""
    quiet_tensorflow()
    main()


if __name__ == "__main__":
    run()
