"""`tfservo compare`: a shadow test's two Data Captures, paired and compared (tfservo.capture.compare)."""

from __future__ import annotations

import json

import click

__all__ = ["compare"]


@click.command()
@click.argument("production")
@click.argument("shadow")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-6, show_default=True,
              help="Numbers that differ by at most this (relative to the production number, absolute below 1) agree.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Write the comparison as JSON too.")
def compare(production: str, shadow: str, tolerance: float, json_path: str | None) -> None:
    """Compare a production variant's captured answers with its shadow variant's.

    PRODUCTION and SHADOW are the variants' capture folders (or s3:// prefixes), as Data Capture
    writes them: DESTINATION/ENDPOINT/VARIANT. Requests are paired by the eventId both lines
    carry; prints how many answers are identical, agree within --tolerance or differ, the
    largest numeric difference, and each side's latency. Exits 1 when no request was paired.
    """
    from tfservo.capture.compare import compare_captures
    from tfservo.core.errors import ServingError

    try:
        result = compare_captures(production, shadow, tolerance)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    for line in result.lines():
        click.echo(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result.as_dict(), f, indent=2)
    if not result.pairs:
        raise click.ClickException("no request was answered by both: is Data Capture on, with Output captured?")
