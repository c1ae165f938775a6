"""`tfservo sign`: a bundle's files signed (tfservo.models.signing), and keys to sign with."""

from __future__ import annotations

import click

__all__ = ["sign"]


@click.command()
@click.argument("path", required=False)
@click.option("--key", "key_file", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="The Ed25519 private key (PEM) to sign with.")
@click.option("--new-key", "new_key_file", metavar="FILE", type=click.Path(exists=False),
              help="Make a key pair: FILE (private, mode 600) and FILE.pub (give it to --require-signature).")
def sign(path: str | None, key_file: str | None, new_key_file: str | None) -> None:
    """Sign PATH (a bundle dir, a model dir or a model.tar.gz) with --key.

    Writes tfservo-signature.json into the dir (or the archive): every file's SHA-256 and an
    Ed25519 signature over them. `serve --require-signature KEYS` (TFSERVO_REQUIRE_SIGNATURE for
    every command and engine) then loads nothing unsigned, altered or added after signing.
    """
    from tfservo.core.errors import ServingError
    from tfservo.models.signing import new_key, sign_path

    if not (new_key_file or (path and key_file)):
        raise click.UsageError("give PATH and --key FILE to sign, or --new-key FILE to make a key pair")
    try:
        if new_key_file:
            click.echo(f"wrote {new_key_file} (private; keep it secret) and {new_key_file}.pub "
                       f"(key {new_key(new_key_file)})")
            key_file = key_file or new_key_file
        if path and key_file:
            written, count = sign_path(path, key_file)
            click.echo(f"signed {count} files of {path}: {written}")
    except FileExistsError:
        raise click.ClickException(f"{new_key_file} exists; --new-key writes a new file") from None
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
