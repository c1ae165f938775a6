"""Generate the docs site's reference pages from their one declaration (run by mkdocs-gen-files
during `mkdocs build`): the settings from tfservo.core.settings, TF Serving's flags from the same
declarations, the HTTP API from the route table's OpenAPI document. The CLI page is rendered by
mkdocs-click from the click commands themselves (docs/reference/cli.md)."""

from __future__ import annotations

from typing import Any

import mkdocs_gen_files

from tfservo.core.settings import Option, options, tfs_flags
from tfservo.http.openapi import openapi_document
from tfservo.models.signatures import SignatureDef, TensorSpec


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(option: Option) -> str:
    if option.multiple:
        return "none"
    if option.kind is bool:
        return "off"
    return "—" if option.default in (None, "") else f"`{option.default}`"


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        "Every setting of `tfservo serve`, generated from its one declaration in",
        "`tfservo/core/settings.py`: a flag wins over an environment variable, which wins over the",
        "default; where several variables are listed, the first one set is read.",
        "",
        "| setting | flags | environment | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for option in options():
        flags = ", ".join(f"`{flag}`" for flag in option.flags) or "—"
        env = ", ".join(f"`{name}`" for name in option.env) or "—"
        what = option.help
        if option.choices:
            what += f" (one of {', '.join(option.choices)})"
        lines.append(f"| `{option.name}` | {flags} | {env} | {_default(option)} | {_cell(what)} |")
    lines += [
        "",
        "## `tensorflow_model_server`",
        "",
        "TF Serving's command line, for scripts and manifests written for its binary; each flag sets",
        "the setting above (flags TF Serving has and tfservo does not use are accepted and listed by",
        "`tensorflow_model_server --help` with a `*`).",
        "",
        "| flag | setting | TF Serving's default |",
        "|---|---|---|",
    ]
    for option in tfs_flags():
        assert option.tfs is not None
        lines.append(f"| `--{option.tfs.name}` | `{option.name}` | `{option.tfs.default}` |")
    return "\n".join(lines) + "\n"


def http_page() -> str:
    """The REST API as /openapi.json describes it, for one example model named `MODEL`."""
    x = TensorSpec("x", "x:0", "DT_FLOAT", (-1,))
    y = TensorSpec("y", "y:0", "DT_FLOAT", (-1,))
    sig = SignatureDef("serving_default", "tensorflow/serving/predict", {"x": x}, {"y": y})
    doc = openapi_document({"MODEL": sig}, multi_model=True, management=True)
    lines = [
        "# HTTP API",
        "",
        "Generated from the route table's OpenAPI document: a running server answers the same document",
        "for the models it serves at `GET /openapi.json` (with their signatures' inputs and examples), and",
        "renders it at `GET /docs` (`pip install 'tfservo[ui]'`). Here for one model named `MODEL`",
        "with a float input `x`; the multi-model and management routes answer only where",
        "[their settings](settings.md) turn them on.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, ops in doc["paths"].items():
        for verb, op in ops.items():
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((path, verb, op))
    for tag, ops in by_tag.items():
        lines += [f"## {tag}", "", "| method | path | what it does | answers |", "|---|---|---|---|"]
        for path, verb, op in ops:
            what = op.get("summary", "")
            if op.get("description"):
                what += " — " + op["description"]
            answers = ", ".join(f"{code}" for code in op.get("responses", {}))
            lines.append(f"| {verb.upper()} | `{path}` | {_cell(what)} | {answers} |")
        lines.append("")
    return "\n".join(lines)


with mkdocs_gen_files.open("reference/settings.md", "w") as f:
    f.write(settings_page())
with mkdocs_gen_files.open("reference/http-api.md", "w") as f:
    f.write(http_page())
