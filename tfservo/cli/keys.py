"""`tfservo keys new`: make an API key, print it once, keep only its hash in the key file."""

from __future__ import annotations

import click

from tfservo.auth.keys import SCOPES


@click.group()
def keys() -> None:
    """API keys with scopes (a key file stores their hashes, never the keys)."""


@keys.command("new")
@click.option("--file", "path", required=True, metavar="FILE", help="The key file (JSON; made if missing, mode 600).")
@click.option("--name", required=True, help="Who holds the key: audit lines name it.")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(SCOPES),
              help="What the key may do (repeatable): invoke models, read metadata and docs, manage models, "
              "scrape metrics.")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="A model the key may call (repeatable) [default: every model].")
def new(path: str, name: str, scopes: tuple[str, ...], models: tuple[str, ...]) -> None:
    """Make a key for NAME, add its hash to FILE and print the key (only this once)."""
    from tfservo.auth.keys import add_key
    from tfservo.core.errors import ServingError

    try:
        click.echo(add_key(path, name, list(scopes), list(models) or None))
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
