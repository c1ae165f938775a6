"""`tfservo export`: a Keras 3 `.keras` file as a checked SavedModel (tfservo.models.keras_export)."""

from __future__ import annotations

import click

from tfservo.core.settings import option

__all__ = ["export"]

_TRUST = option("trust_model_code")


@click.command()
@click.argument("source", metavar="KERAS")
@click.argument("target", metavar="TARGET")
@click.option("--trust-model-code", "trust", is_flag=True, default=None,
              help=f"Load a model that runs code on load (Lambda layers, stored bytecode) [env: {_TRUST.env[0]}].")
@click.option("--rows", default=8, show_default=True, type=click.IntRange(1, 4096),
              help="Generated rows both are run on.")
@click.option("--rtol", default=1e-5, show_default=True, type=click.FloatRange(0), help="Relative tolerance.")
@click.option("--atol", default=1e-5, show_default=True, type=click.FloatRange(0), help="Absolute tolerance.")
def export(source: str, target: str, trust: bool | None, rows: int, rtol: float, atol: float) -> None:
    """Write KERAS (a .keras file, or a version dir holding one) to TARGET as a SavedModel.

    The SavedModel has the signature Keras's own model.export gives it (serving_default; inputs
    named by the input layers), so TF Serving and the SageMaker container serve it as tfservo
    serves the .keras file. Both are run on the same generated rows and compared; TARGET is
    written only when every output is within |keras - savedmodel| <= atol + rtol·|keras|
    (exit 1 otherwise). Name TARGET as a version dir, e.g. export/mymodel/1.
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.logs import setup_logging
    from tfservo.core.settings import ConfigError, resolve_settings

    setup_logging("warning")
    try:
        trusted = trust or resolve_settings(serving=False, serve_default_path=False).trust_model_code
    except ConfigError as exc:
        raise click.UsageError(exc.message) from None
    from tfservo.models.keras_export import export_checked

    try:
        check = export_checked(source, target, trust_code=trusted, rows=rows, rtol=rtol, atol=atol)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    click.echo("\n".join(check.lines()))
