"""What a model can do beyond computing, read from its files before it runs.

`scan_version` reads a version dir: a SavedModel's graph ops that touch the file system or the
network or run Python — only those a signature or an init op reaches, each named with the function
that holds it (the saver's own Save/Restore are how every SavedModel loads and are not reached
from a signature) —, assets that resolve outside the version dir, and a `.keras` file's layers that
run code (tfservo.models.keras_model). `scan_code` lists a bundle's code/ files with their SHA-256:
code by design, so listed and never refused here (signing covers it, tfservo.models.signing).
`check_version` applies the scan policy to one load; every load passes through it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tfservo.core.errors import Code, ModelLoadError
from tfservo.core.paths import within
from tfservo.core.settings import option

__all__ = ["RISKY_OPS", "Finding", "check_version", "policy_for", "scan_code", "scan_version"]

log = logging.getLogger("tfservo.models")

# op type → what it does beyond computing; reads, writes, lists, maps files, reaches the network, runs Python
RISKY_OPS: dict[str, str] = {
    **dict.fromkeys(("ReadFile", "MatchingFiles", "ImmutableConst", "TFRecordDataset", "TFRecordDatasetV2",
                     "TextLineDataset", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2",
                     "LoadAndRemapMatrix", "GenerateVocabRemapping", "Restore", "RestoreV2", "RestoreSlice"),
                    "reads files at a path the graph computes"),
    **dict.fromkeys(("WriteFile", "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "CreateSummaryFileWriter",
                     "DebugIdentityV2", "DebugIdentityV3"),
                    "writes files at a path the graph computes"),
    **dict.fromkeys(("RpcClient", "RpcCall", "RpcServer", "RpcServerStart", "RpcServerRegister", "Rpc", "TryRpc"),
                    "reaches the network"),
    **dict.fromkeys(("PyFunc", "PyFuncStateless", "EagerPyFunc"), "runs Python code"),
}
_SAVED_MODEL = "saved_model.pb"
_INIT_OPS = ("saved_model_main_op", "legacy_init_op")


@dataclass(frozen=True)
class Finding:
    """One thing a model or bundle can do beyond computing."""

    kind: str  # "op", "asset", "keras" or "code"
    path: str  # the file or dir it is in
    what: str  # a sentence: what it is, where
    enforced: bool = True  # False: listed only (code/ files: code by design)

    def __str__(self) -> str:
        return self.what


def scan_version(path: str, *, keras_layers: bool = True) -> list[Finding]:
    """The findings of the version dir `path` (a SavedModel, a `.keras` file's dir, a TFLite file's);
    `keras_layers=False` leaves out a `.keras` file's, which its load checks itself."""
    from tfservo.models.bundle import keras_file

    found: list[Finding] = []
    keras = keras_file(path) if keras_layers else None
    if keras is not None:
        from tfservo.models.keras_model import keras_findings

        found += [Finding("keras", keras, f"{os.path.basename(keras)}: {f}") for f in keras_findings(keras)]
    graph = os.path.join(path, _SAVED_MODEL)
    if os.path.isfile(graph):
        found += _graph_findings(graph)
    found += _outside_links(path)
    return found


def scan_code(code_dir: str) -> list[Finding]:
    """Every file under a bundle's `code_dir` with its SHA-256 (listed, not enforced)."""
    from tfservo.models.signing import listed_files, sha256_file

    return [Finding("code", os.path.join(code_dir, rel), f"code/{rel} sha256 {sha256_file(os.path.join(code_dir, rel))}",
                    enforced=False) for rel in listed_files(code_dir)]


def policy_for(setting: str, arrived: str | None) -> str:
    """The scan policy one load applies: the setting, or for auto, refuse where the model arrived
    from elsewhere (`arrived` names how: s3://, the management API, a Target-Model header), else warn."""
    if setting != "auto":
        return setting
    return "refuse" if arrived else "warn"


def check_version(path: str, label: str, setting: str, arrived: str | None) -> None:
    """Scan the version dir `path` (`label`: model and version, for messages) and apply the policy:
    warn logs one line, refuse raises ModelLoadError naming each finding and how to allow it."""
    policy = policy_for(setting, arrived)
    if policy == "allow":
        return
    found = [f for f in scan_version(path, keras_layers=False) if f.enforced]  # Keras's: --trust-model-code
    if not found:
        return
    listed = "; ".join(str(f) for f in found)
    if policy == "warn":
        log.warning("%s at %s can do more than compute: %s (scan policy warn: loaded; `tfservo scan` lists it)",
                    label, path, listed)
        return
    scan = option("scan_policy")
    because = f" It arrived through {arrived}, where the scan policy refuses these." if arrived else ""
    raise ModelLoadError(
        f"Refusing to load {label} from {path}: it can do more than compute: {listed}.{because} Allow it with "
        f"{scan.flags[0]} warn (or {scan.env[0]}=warn) if you trust where it came from",
        Code.FAILED_PRECONDITION,
    )


def _graph_findings(graph: str) -> list[Finding]:
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        with open(graph, "rb") as f:
            saved.ParseFromString(f.read())
    except Exception:
        return []
    found: list[Finding] = []
    for meta in saved.meta_graphs:
        functions = {fn.signature.name: fn for fn in meta.graph_def.library.function}
        for op, holder in _reached_ops(meta, functions):
            if op.op in RISKY_OPS:
                where = f"function {holder}" if holder else "the graph"
                found.append(Finding("op", graph, f"op {op.op} '{op.name}' in {where} {RISKY_OPS[op.op]}"))
        version_dir = os.path.dirname(graph)
        for asset in meta.asset_file_def:
            target = os.path.join(version_dir, "assets", asset.filename)
            if not _inside(target, version_dir):
                found.append(Finding("asset", graph, f"asset {asset.filename!r} (tensor {asset.tensor_info.name}) "
                                                     "resolves outside the model"))
    return found


def _reached_ops(meta: Any, functions: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    """The nodes a signature or an init op reaches, with the function holding each ("" for the graph)."""
    nodes = {node.name: node for node in meta.graph_def.node}
    wanted = [tensor.name for sig in meta.signature_def.values()
              for tensor in [*sig.inputs.values(), *sig.outputs.values()]]
    for key in _INIT_OPS:
        if key in meta.collection_def:
            wanted += list(meta.collection_def[key].node_list.value)
    stack = [_node_name(name) for name in wanted]
    seen: set[str] = set()
    called: list[str] = []
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        yield node, ""
        stack += [_node_name(i) for i in node.input]
        called += _functions_of(node)
    done: set[str] = set()
    while called:
        fname = called.pop()
        if fname in done or fname not in functions:
            continue
        done.add(fname)
        for node in functions[fname].node_def:
            yield node, fname
            called += _functions_of(node)


def _functions_of(node: Any) -> Iterable[str]:
    for attr in node.attr.values():
        if attr.HasField("func"):
            yield attr.func.name
        yield from (fn.name for fn in attr.list.func)


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":", 1)[0]


def _outside_links(path: str) -> list[Finding]:
    """Links in the version dir that resolve outside it (a model reading another's or the host's files)."""
    found = []
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = os.path.join(root, name)
            if os.path.islink(entry) and not _inside(entry, path):
                found.append(Finding("asset", entry, f"{os.path.relpath(entry, path)} links to "
                                                     f"{os.readlink(entry)!r}, outside the model"))
    return found


def _inside(entry: str, root: str) -> bool:
    return within(os.path.realpath(entry), os.path.realpath(root))
