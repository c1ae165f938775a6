"""`tfservo inspect`: a bundle's models, versions, code and signatures, as saved_model_cli prints them."""

from __future__ import annotations

from tfservo.bundle import open_bundle
from tfservo.errors import ServingError
from tfservo.runtime.signatures import SignatureDef, TensorSpec


def describe_bundle(path: str) -> str:
    """A human-readable description of every model and version in the bundle at `path`."""
    from tfservo.runtime.savedmodel import load_saved_model

    bundle = open_bundle(path)
    lines = [f"Bundle: {bundle.source}"]
    if bundle.code_dir:
        lines.append(f"Universal code: {bundle.code_dir}")
    default = bundle.default_model_name()
    for name, source in bundle.models.items():
        mark = " (default)" if name == default else ""
        lines.append("")
        lines.append(f"Model {name}{mark}: {source.base_path}")
        if source.code_dir:
            lines.append(f"  Code: {source.code_dir}")
        for version, vpath in source.versions.items():
            latest = " (latest)" if version == source.latest_version else ""
            lines.append(f"  Version {version}{latest}: {vpath}")
            try:
                model = load_saved_model(vpath)
            except ServingError as exc:
                lines.append(f"    failed to load: {exc.message}")
                continue
            try:
                lines.append("    MetaGraphDef with tag-set: 'serve' contains the following SignatureDefs:")
                for sig_name in sorted(model.signatures):
                    lines.extend("    " + ln if ln else "" for ln in _describe_signature(model.signatures[sig_name]))
            finally:
                model.close()
    return "\n".join(lines)


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
