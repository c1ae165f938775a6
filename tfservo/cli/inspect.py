"""`tfservo inspect`: a bundle's models, versions, code and signatures, as saved_model_cli prints them.

The bundle is loaded through the one service factory, so the default model, failed versions
and handler code shown are exactly what `tfservo serve` would serve.
"""

from __future__ import annotations

from tfservo.core.settings import Settings
from tfservo.models.bundle import ModelSource
from tfservo.models.signatures import SignatureDef, TensorSpec
from tfservo.service.factory import ModelService, build_service

__all__ = ["describe_bundle"]


def describe_bundle(settings: Settings) -> str:
    """A human-readable description of every model and version in settings.paths."""
    service = build_service(settings)
    try:
        lines: list[str] = []
        for bundle in service.bundles:
            lines.append(f"Bundle: {bundle.source}")
            if bundle.code_dir:
                lines.append(f"Universal code: {bundle.code_dir}")
            for name, source in bundle.models.items():
                _describe_model(service, name, source, lines)
        return "\n".join(lines)
    finally:
        service.close()


def _describe_model(service: ModelService, name: str, source: ModelSource, lines: list[str]) -> None:
    mark = " (default)" if name == service.default_model() else ""
    lines.append("")
    lines.append(f"Model {name}{mark}: {source.base_path}")
    if source.code_dir:
        lines.append(f"  Code: {source.code_dir}")
    served = service.manager.model(name)
    for version, vpath in source.versions.items():
        latest = " (latest)" if version == source.latest_version else ""
        lines.append(f"  Version {version}{latest}: {vpath}")
        sv = served.versions.get(version)
        if sv is None or sv.model is None:
            lines.append(f"    failed to load: {sv.error if sv is not None else 'not loaded'}")
            continue
        lines.append("    MetaGraphDef with tag-set: 'serve' contains the following SignatureDefs:")
        for sig_name in sorted(sv.model.signatures):
            lines.extend("    " + ln if ln else "" for ln in _describe_signature(sv.model.signatures[sig_name]))


def _describe_signature(sig: SignatureDef) -> list[str]:
    out = ["", f"signature_def['{sig.name}']:"]
    out.append("  The given SavedModel SignatureDef contains the following input(s):")
    out.extend(_describe_tensor("inputs", spec) for spec in sig.inputs.values())
    out.append("  The given SavedModel SignatureDef contains the following output(s):")
    out.extend(_describe_tensor("outputs", spec) for spec in sig.outputs.values())
    out.append(f"  Method name is: {sig.method_name}")
    return out


def _describe_tensor(kind: str, spec: TensorSpec) -> str:
    shape = "unknown_rank" if spec.shape is None else "(" + ", ".join(map(str, spec.shape)) + ("," if len(spec.shape) == 1 else "") + ")"
    return (
        f"    {kind}['{spec.key}'] tensor_info:\n"
        f"        dtype: {spec.dtype}\n"
        f"        shape: {shape}\n"
        f"        name: {spec.tensor_name}"
    )
