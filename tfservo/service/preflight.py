"""The checks `serve`, `invoke`, `transform` and `inspect` make before TensorFlow is imported
and before any worker starts, so that a wrong path, a bundle without models, a syntax error in
inference.py or a handler missing from it is answered in a fraction of a second, naming the
user's own file (inside an archive: `model.tar.gz:code/inference.py, line 7`).

A remote bundle (s3://…) is checked where it is downloaded, by the loader: fetching it twice
would cost more than the check saves. What passes here the loader checks again; this never
refuses what the loader would serve.
"""

from __future__ import annotations

import ast
import os
import posixpath
import tarfile
from collections.abc import Iterable, Iterator

from tfservo.core.archive_limits import ArchiveLimits
from tfservo.core.errors import BundleError, BundleNotFound
from tfservo.handlers.handler_names import HANDLER_NAMES, chosen_handlers
from tfservo.models.bundle import (
    CODE_DIR_NAME,
    KERAS_SUFFIX,
    LAYOUTS,
    SAVED_MODEL_FILES,
    TFLITE_MODEL_FILE,
    open_bundle,
)

__all__ = ["check_bundles", "check_handler_source"]

_INFERENCE = "inference.py"
_MODEL_FILES = (*SAVED_MODEL_FILES, TFLITE_MODEL_FILE)


def check_bundles(paths: Iterable[str], limits: ArchiveLimits | None = None, *, code_only: bool = False) -> None:
    """Check each local bundle in `paths` as far as it can be without TensorFlow (see the module);
    `code_only`: a bundle may be code/ alone (a pipeline's containers)."""
    for path in paths:
        local = _local(path)
        if local is None:
            continue
        if os.path.isfile(local) and tarfile.is_tarfile(local):
            _check_archive(local, path, code_only)
            continue
        if not os.path.exists(local):
            raise BundleNotFound(f"model path {path} does not exist; check the path. {LAYOUTS}")
        bundle = open_bundle(local, limits=limits, code_only=code_only)  # a directory: scanned, nothing copied
        code_dirs = {bundle.code_dir, *(model.code_dir for model in bundle.models.values())}
        for code_dir in sorted(d for d in code_dirs if d):
            script = os.path.join(code_dir, _INFERENCE)
            if os.path.isfile(script):
                with open(script, "rb") as f:
                    check_handler_source(f.read(), script)


def check_handler_source(source: bytes, shown_as: str) -> None:
    """A BundleError, naming `shown_as` and the line, if `source` (an inference.py) does not
    compile, or plainly binds no whole set of handlers (`handler`, or `input_handler` with
    `output_handler`). A module whose names cannot be read without running it (`import *`,
    assignments through globals()) is let through to the import, which decides."""
    try:
        tree = ast.parse(source, filename=shown_as)
        compile(tree, shown_as, "exec")  # what parsing lets through: `return` outside a function, …
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise BundleError(
            f"{shown_as}, line {exc.lineno}: SyntaxError: {exc.msg}{f' ({line})' if line else ''}; "
            "fix it and start again"
        ) from None
    except ValueError as exc:  # source with a NUL byte
        raise BundleError(f"{shown_as}: {exc}; it must be Python source") from None
    names = set(_bound_names(tree.body))
    if "*" in names or "globals" in _called_names(tree):
        return
    chosen_handlers(names & set(HANDLER_NAMES), shown_as)


def _check_archive(archive: str, source: str, code_only: bool = False) -> None:
    """An archive's listing: it must hold a model (or, `code_only`, a code/inference.py); each
    code/inference.py in it is checked as it is, read from the archive without extracting the rest."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            has_code = any(_member_path(m.name).split("/")[-2:] == [CODE_DIR_NAME, _INFERENCE] for m in members)
            if not any(posixpath.basename(m.name) in _MODEL_FILES or m.name.endswith(KERAS_SUFFIX)
                       for m in members) and not (code_only and has_code):
                raise BundleError(f"no models found in {source}: it holds no {' or '.join(_MODEL_FILES)} "
                                  f"or *{KERAS_SUFFIX}; {LAYOUTS}")
            for member in members:
                name = _member_path(member.name)
                parts = name.split("/")
                if parts[-1] == _INFERENCE and len(parts) >= 2 and parts[-2] == CODE_DIR_NAME:
                    f = tar.extractfile(member)
                    if f is not None:
                        check_handler_source(f.read(), f"{source}:{name}")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"model path {source} is not a readable tar archive ({exc}); {LAYOUTS}") from None


def _member_path(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def _local(path: str) -> str | None:
    if "://" not in path:
        return os.path.abspath(os.path.expanduser(path))
    scheme, rest = path.split("://", 1)
    return rest if scheme.lower() in ("file", "local") else None


def _bound_names(body: list[ast.stmt]) -> Iterator[str]:
    """Names a module's top level binds, through if/try/with blocks (not inside functions)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield alias.asname or alias.name.split(".")[0]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.AsyncWith, ast.AsyncFor)):
            yield from _bound_names(node.body)
            yield from _bound_names(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            for block in (node.body, node.orelse, node.finalbody):  # type: ignore[attr-defined]
                yield from _bound_names(block)
            for handler in node.handlers:  # type: ignore[attr-defined]
                yield from _bound_names(handler.body)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.NamedExpr):
            yield node.value.target.id


def _called_names(tree: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
