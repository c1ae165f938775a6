"""`tfservo scan`: what a bundle's models and code can do beyond computing, before anything runs.

Nothing in the bundle is imported or loaded: the graphs are read as protobufs and the `.keras`
configs as JSON (tfservo.models.scan); loading applies the same findings (--scan-policy).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from tfservo.core.settings import option

if TYPE_CHECKING:
    from tfservo.models.signing import TrustedKeys

__all__ = ["scan"]

_SCAN = option("scan_policy")


@click.command()
@click.argument("path")
@click.option("--keys", default=None, metavar="KEYS", type=click.Path(exists=True, dir_okay=False),
              help="Check the bundle's signature against these Ed25519 public keys (as --require-signature).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the report as one JSON document.")
def scan(path: str, keys: str | None, as_json: bool) -> None:
    """Report what PATH's models and code can do beyond computing.

    Lists graph ops that touch the file system or the network or run Python (with the function
    that holds them), Keras layers that run code, assets that point outside the model, and the
    code/ files (with their SHA-256), and whether the bundle is signed. Exits 1 when a model
    has a finding that loading warns about or refuses (see --scan-policy on serve).
    """
    from tfservo.core.errors import ServingError
    from tfservo.core.logs import setup_logging

    setup_logging("warning")
    try:
        report = _report(path, keys)
    except ServingError as exc:
        raise click.ClickException(exc.message) from None
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo("\n".join(_lines(report)))
    if any(f["enforced"] for f in report["findings"]):
        raise SystemExit(1)


def _report(path: str, keys: str | None) -> dict[str, Any]:
    from tfservo.core.settings import ConfigError, resolve_settings
    from tfservo.models.bundle import open_bundle
    from tfservo.models.scan import scan_code, scan_version
    from tfservo.models.signing import TrustedKeys

    try:  # an archive is opened within the limits serve would apply (TFSERVO_ARCHIVE_* in the environment)
        limits = resolve_settings(paths=[path], serving=False, serve_default_path=False).archive_limits
    except ConfigError as exc:
        raise click.UsageError(exc.message) from None
    bundle = open_bundle(path, limits=limits)
    findings: list[dict[str, object]] = []
    trusted = TrustedKeys(keys) if keys else None
    signature: dict[str, object] = {"checked": trusted is not None, "refusals": []}
    refusals: list[str] = []
    code_dirs = {bundle.code_dir} if bundle.code_dir else set()
    for name, source in bundle.models.items():
        if source.code_dir:
            code_dirs.add(source.code_dir)
        for version, vpath in source.versions.items():
            for found in scan_version(vpath):
                findings.append({"model": name, "version": version, "kind": found.kind, "path": found.path,
                                 "what": found.what, "enforced": found.enforced})
            if trusted is not None:
                refusals += _refusal(vpath, trusted, f"model {name} version {version}")
    for code_dir in sorted(code_dirs):
        findings += [{"model": None, "version": None, "kind": f.kind, "path": f.path, "what": f.what,
                      "enforced": f.enforced} for f in scan_code(code_dir)]
        if trusted is not None:
            refusals += _refusal(code_dir, trusted, "code")
    signature["refusals"] = refusals
    signature["files"] = _signature_files(bundle.root)
    return {"bundle": path, "models": sorted(bundle.models), "findings": findings, "signature": signature}


def _refusal(path: str, trusted: TrustedKeys, what: str) -> list[str]:
    """What --require-signature would say about `path` ([] when it loads)."""
    from tfservo.core.errors import ServingError
    from tfservo.models.signing import verify_dir

    try:
        verify_dir(path, trusted, what)
    except ServingError as exc:
        return [exc.message]
    return []


def _signature_files(root: str) -> list[str]:
    from tfservo.models.signing import SIGNATURE_FILE

    return sorted(os.path.join(r, SIGNATURE_FILE) for r, _, files in os.walk(root) if SIGNATURE_FILE in files)


def _lines(report: dict[str, Any]) -> list[str]:
    findings: list[dict[str, Any]] = report["findings"]
    out = [f"Bundle: {report['bundle']} (models: {', '.join(report['models']) or 'none'})"]
    models = [f for f in findings if f["model"] is not None]
    if models:
        out.append("Beyond computing:")
        out += [f"  model {f['model']} version {f['version']}: {f['what']}" for f in models]
    else:
        out.append("Beyond computing: nothing found in the graphs, Keras configs or assets")
    code = [f for f in findings if f["kind"] == "code"]
    if code:
        out.append("Code (runs by design; review it, sign the bundle):")
        out += [f"  {f['what']}" for f in code]
    signature = report["signature"]
    if not signature["checked"]:
        out.append(f"Signature: {', '.join(signature['files']) or 'none'} (not checked: --keys KEYS checks it)")
    elif signature["refusals"]:
        out.append("Signature: --require-signature would refuse:")
        out += [f"  {r}" for r in signature["refusals"]]
    else:
        out.append("Signature: every model and code file is signed by a key in --keys")
    graph = sum(1 for f in models if f["enforced"] and f["kind"] != "keras")
    keras = sum(1 for f in models if f["kind"] == "keras")
    if graph:
        out.append(f"{graph} graph or asset finding(s): loading warns for a path given to it and refuses models "
                   f"from s3://, the management API and Target-Model loads ({_SCAN.flags[0]} decides)")
    if keras:
        out.append(f"{keras} Keras finding(s): loading refuses them unless --trust-model-code (a class the "
                   "bundle's code/inference.py registers loads without it)")
    return out
