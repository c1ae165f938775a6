"""Load a bundle's code/inference.py and run it the way the container's python_service does.

`handler(data, context)` alone, or `input_handler(data, context)` → TF Serving →
`output_handler(response, context)`; `data` is a binary stream of the request body and
`response` a real requests.Response. code/lib (or packages from code/requirements.txt) and
code/ itself are importable, as with the container's gunicorn --pythonpath.
"""

from __future__ import annotations

import datetime
import hashlib
import http
import importlib.util
import io
import logging
import os
import shutil
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import IO, TYPE_CHECKING, NamedTuple

import orjson
import requests
import requests.adapters
import urllib3
from requests.structures import CaseInsensitiveDict

from tfservo.codecs.media_types import JSON
from tfservo.core import tracing
from tfservo.core.errors import BundleError, HandlerError
from tfservo.core.logs import failure_level
from tfservo.handlers.handler_names import HANDLER_NAMES, chosen_handlers
from tfservo.handlers.shadowing import check_shadowed_imports, satisfied_here

if TYPE_CHECKING:
    import grpc

__all__ = [
    "DEFAULT_CONTENT_TYPE",
    "Context",
    "Handlers",
    "install_requirements",
    "load_handlers",
    "make_requests_response",
    "TfsCall",
    "unload_handlers",
]

log = logging.getLogger("tfservo.handlers")

DEFAULT_CONTENT_TYPE = JSON
_MARKER = ".tfservo-requirements"


class Context(NamedTuple):
    """The `context` handlers get: the container's fields in its order, then grpc_uri.

    The container (tfs_utils.Context) has exactly the first ten; grpc_uri (`host:port`) is
    what older SageMaker docs and scripts use, so it is appended where it shifts nothing.
    """

    model_name: str | None
    model_version: str | None
    method: str | None
    rest_uri: str
    grpc_port: int | str | None
    channel: grpc.Channel | None  # to this server's gRPC API, shared; None without one
    custom_attributes: str | None
    request_content_type: str | None
    accept_header: str | None
    content_length: int | None
    grpc_uri: str | None = None


# The body is bytes/str, or a request dict holding numpy arrays (see Handlers._request_body).
TfsCall = Callable[[bytes | str | dict[str, object], Context], requests.Response]
Handler = Callable[..., object]  # a function of inference.py


def _holds_arrays(doc: dict[str, object]) -> bool:
    """True for a TF Serving request whose instances/inputs are numpy arrays (passed on unserialized)."""
    import numpy as np

    inputs = doc.get("inputs")
    values = [doc.get("instances"), inputs]
    if isinstance(inputs, dict):
        values += list(inputs.values())
    return any(isinstance(v, np.ndarray) for v in values)


@dataclass(frozen=True)
class Handlers:
    """The handler functions of one inference.py."""

    path: str
    module: ModuleType
    handler: Handler | None = None
    input_handler: Handler | None = None
    output_handler: Handler | None = None
    path_entries: tuple[str, ...] = ()  # what loading put on sys.path, released by unload_handlers
    shown: str = ""  # how errors name the file: the user's archive and member, where it came from one

    @property
    def where(self) -> str:
        return self.shown or self.path

    def call(
        self, data: bytes | IO[bytes], context: Context, tfs_call: TfsCall
    ) -> tuple[bytes, str, str | None]:
        """Run the user flow on one request body; returns (body, content type, custom attributes
        for the answer's X-Amzn-SageMaker-Custom-Attributes, or None).

        Exceptions in user code become HandlerError (500) with the exception's message, as the
        container answers {"error": str(e)}; errors raised by `tfs_call` itself pass through.
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = io.BytesIO(bytes(data))
        if self.handler is not None:
            result = self._run("handler", self.handler, data, context)
        else:
            assert self.input_handler is not None and self.output_handler is not None
            processed = self._run("input_handler", self.input_handler, data, context)
            response = tfs_call(self._request_body(processed), context)
            result = self._run("output_handler", self.output_handler, response, context)
        try:
            return self._result(result)
        except HandlerError as exc:  # the answer says it too; the log is where an operator looks
            log.error("%s", exc.message)
            raise

    def _run(self, name: str, function: Handler, *args: object) -> object:
        try:
            with tracing.span(name, {"code.function.name": name, "code.file.path": self.path}):
                return function(*args)
        except BaseException as exc:
            log.log(failure_level(), "%s in %s raised %s", name, self.where, type(exc).__name__, exc_info=True)
            error = HandlerError(str(exc) or type(exc).__name__)
            error.user_traceback = traceback.format_exc()  # type: ignore[attr-defined]
            raise error from exc

    def _request_body(self, processed: object) -> bytes | str | dict[str, object]:
        """What input_handler returned, as the body of the TF Serving request."""
        if isinstance(processed, (str, bytes)):
            return processed
        if isinstance(processed, (bytearray, memoryview)):
            return bytes(processed)
        if processed is None:
            return b""  # requests.post(data=None) sends an empty body too
        if isinstance(processed, dict) and _holds_arrays(processed):
            # {"instances": ndarray} / {"inputs": ndarray or {name: ndarray}} goes to TF
            # Serving's API as is: the same request as its JSON, without writing and parsing it
            # (for a 224×224×3 image that round trip cost 50–80 ms).
            return processed
        if isinstance(processed, (dict, list)):
            # The container's requests.post(data=dict) would form-encode it, which TF Serving
            # rejects; the evident intent is a JSON request, so send that.
            try:
                return orjson.dumps(processed, option=orjson.OPT_SERIALIZE_NUMPY)
            except orjson.JSONEncodeError as exc:
                raise HandlerError(
                    f"input_handler in {self.where} returned a {type(processed).__name__} that "
                    f"is not JSON-serializable ({exc}); return json.dumps(...) of plain values"
                ) from exc
        read = getattr(processed, "read", None)
        if callable(read):
            return self._request_body(self._run("input_handler's returned stream .read()", read))
        raise HandlerError(
            f"input_handler in {self.where} returned {type(processed).__name__}; return the TF "
            "Serving request body as str or bytes, e.g. json.dumps({'instances': [...]})"
        )

    def _result(self, result: object) -> tuple[bytes, str, str | None]:
        """(body, content_type[, custom_attributes]) or a bare body, as bytes, a content type
        string and the custom attributes to answer with (SageMaker passes them to the caller)."""
        name = "handler" if self.handler is not None else "output_handler"
        content_type: object = DEFAULT_CONTENT_TYPE
        attributes: object = None
        if isinstance(result, (tuple, list)):
            if len(result) not in (2, 3):
                raise HandlerError(
                    f"{name} in {self.where} returned a {type(result).__name__} of {len(result)} "
                    "items; return (body, content_type), (body, content_type, custom_attributes) or just the body"
                )
            result, content_type, *rest = result
            attributes = rest[0] if rest else None
            if attributes is not None and not (isinstance(attributes, str) and attributes.isascii()):
                raise HandlerError(
                    f"{name} in {self.where} returned custom attributes {attributes!r:.80}; "
                    "they must be an ASCII str such as 'trace=abc,cached=true'"
                )
        if isinstance(result, str):
            body = result.encode()
        elif isinstance(result, (bytes, bytearray, memoryview)):
            body = bytes(result)
        elif result is None:
            body = b""
        else:
            lazy = hasattr(result, "__next__")  # zip, map, a generator: nothing to send until listed
            raise HandlerError(
                f"{name} in {self.where} returned a body of type {type(result).__name__}"
                + (" (an iterator): return json.dumps(list(...)) of it" if lazy else "")
                + "; the body must be str or bytes (e.g. json.dumps(...)), optionally as (body, content_type)"
            )
        if content_type is None:
            content_type = DEFAULT_CONTENT_TYPE
        elif isinstance(content_type, bytes):
            content_type = content_type.decode("latin-1")
        elif not isinstance(content_type, str):
            raise HandlerError(
                f"{name} in {self.where} returned content type {content_type!r}; "
                "it must be a str such as 'application/json'"
            )
        return body, content_type, attributes if isinstance(attributes, str) else None


def load_handlers(
    code_dir: str, *, module_name: str, extra_paths: tuple[str, ...] = (), shown_as: str | None = None
) -> Handlers | None:
    """Import code_dir/inference.py as `module_name`; None if there is none.

    code_dir/lib (if any), code_dir and `extra_paths` go to the front of sys.path first (and
    leave it again with `unload_handlers`). An inference.py that does not import, or defines
    neither `handler` nor both of `input_handler`/`output_handler`, is a BundleError naming
    the file and line.
    """
    path = os.path.abspath(os.path.join(code_dir, "inference.py"))
    if not os.path.isfile(path):
        return None
    code = os.path.abspath(code_dir)
    lib = os.path.join(code, "lib")
    # Same order as the container's gunicorn --pythonpath code,code/lib: lib first.
    entries = (*((lib,) if os.path.isdir(lib) else ()), code, *extra_paths)
    with _IMPORT_LOCK:
        _acquire_paths(entries)
        try:
            module = _import(path, module_name)
            found = _handler_functions(module, shown_as or path)
        except BundleError as exc:
            _release_paths(entries)
            if shown_as:  # the extracted copy's path means nothing to the user: their archive's
                raise BundleError(exc.message.replace(path, shown_as)) from exc.__cause__
            raise
        except BaseException:
            _release_paths(entries)
            raise
    return Handlers(path, module, *found, path_entries=entries, shown=shown_as or "")


def unload_handlers(handlers: Handlers) -> None:
    """Forget an inference.py: its module, its code dir's helper modules and its sys.path entries."""
    with _IMPORT_LOCK:
        code_dir = os.path.dirname(handlers.path)
        if sys.modules.get(handlers.module.__name__) is handlers.module:
            del sys.modules[handlers.module.__name__]
        for name, module in _HELPERS.pop(code_dir, {}).items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        _release_paths(handlers.path_entries)


def reload_handlers(old: Handlers, module_name: str) -> Handlers:
    """A fresh import of `old`'s inference.py, its code dir's helper modules and lib/ as
    `module_name`. On success `old` is forgotten; on failure (a BundleError naming file and
    line) everything stays as it was, so `old` keeps answering."""
    code_dir = os.path.dirname(old.path)
    # what load_handlers put on sys.path besides lib/ and the code dir: requirement targets
    extra = tuple(e for e in old.path_entries if e not in (code_dir, os.path.join(code_dir, "lib")))
    with _IMPORT_LOCK:
        helpers = _HELPERS.pop(code_dir, {})
        for name, module in helpers.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]  # imported again from the edited files
        try:
            new = load_handlers(code_dir, module_name=module_name, extra_paths=extra, shown_as=old.shown or None)
            if new is None:
                raise BundleError(f"{old.path} is gone; put inference.py back (the previous handler keeps answering)")
        except BaseException:
            for name, module in _HELPERS.pop(code_dir, {}).items():
                if sys.modules.get(name) is module:
                    del sys.modules[name]
            _HELPERS[code_dir] = helpers
            for name, module in helpers.items():
                sys.modules.setdefault(name, module)
            raise
        if sys.modules.get(old.module.__name__) is old.module:
            del sys.modules[old.module.__name__]
        _release_paths(old.path_entries)
    return new


def _handler_functions(module: ModuleType, path: str) -> tuple[Handler | None, Handler | None, Handler | None]:
    """(handler, input_handler, output_handler) of an imported inference.py, checked."""
    handler = _function(module, "handler", path)
    input_handler = _function(module, "input_handler", path)
    output_handler = _function(module, "output_handler", path)
    defined = {name for name, fn in zip(HANDLER_NAMES, (handler, input_handler, output_handler)) if fn is not None}
    if chosen_handlers(defined, path) == ("handler",):
        if input_handler or output_handler:
            log.warning("%s defines handler; its input_handler/output_handler are not used", path)
        return handler, None, None
    return None, input_handler, output_handler


# Imports of handler code and the sys.path / sys.modules bookkeeping around them happen one at
# a time (services load bundles from several threads in multi-model mode).
_IMPORT_LOCK = threading.RLock()
# sys.path entries tfservo added → how many loaded handlers use them; removed at zero.
_PATH_USERS: dict[str, int] = {}


def _acquire_paths(entries: tuple[str, ...]) -> None:
    for entry in reversed(entries):  # the first entry ends up first on sys.path
        _PATH_USERS[entry] = _PATH_USERS.get(entry, 0) + 1
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _release_paths(entries: tuple[str, ...]) -> None:
    for entry in entries:
        users = _PATH_USERS.get(entry, 0) - 1
        if users > 0:
            _PATH_USERS[entry] = users
            continue
        _PATH_USERS.pop(entry, None)
        while entry in sys.path:
            sys.path.remove(entry)


def _function(module: ModuleType, name: str, path: str) -> Handler | None:
    value = getattr(module, name, None)
    if value is not None and not callable(value):
        raise BundleError(f"{path}: {name} is a {type(value).__name__}, not a function")
    return value


# Helper modules each code dir's inference.py imported (code dir → {module name: module}).
_HELPERS: dict[str, dict[str, ModuleType]] = {}


class _IsolatedHelpers:
    """While one inference.py is imported, its code dir comes first on sys.path and other code
    dirs' helper modules leave sys.modules, so two bundles' `import utils` each get their own.

    Afterwards the modules imported from this code dir are noted as its own; those of other
    code dirs come back unless this one defined the same name (each handler keeps the module
    it imported either way).
    """

    def __init__(self, code_dir: str) -> None:
        self.code_dir = code_dir
        self.roots = (code_dir + os.sep,)

    def __enter__(self) -> None:
        self.hidden = {
            name: module
            for other, modules in _HELPERS.items()
            if other != self.code_dir
            for name, module in modules.items()
            if sys.modules.get(name) is module
        }
        for name in self.hidden:
            del sys.modules[name]
        self.before = {name for name, _ in _modules()}
        if sys.path[: len(self._entries())] != self._entries():
            for entry in self._entries():
                if entry in sys.path:
                    sys.path.remove(entry)
            sys.path[:0] = self._entries()
        importlib.invalidate_caches()

    def _entries(self) -> list[str]:
        lib = os.path.join(self.code_dir, "lib")
        return [lib, self.code_dir] if os.path.isdir(lib) else [self.code_dir]

    def __exit__(self, *exc: object) -> None:
        own = {
            name: module
            for name, module in _modules()
            if name not in self.before and _module_file(module).startswith(self.roots)
        }
        _HELPERS.setdefault(self.code_dir, {}).update(own)
        for name, module in self.hidden.items():
            sys.modules.setdefault(name, module)


def _modules() -> list[tuple[str, ModuleType]]:
    """A snapshot of sys.modules. Copying it can meet an import made meanwhile (a finalizer run by
    the garbage collector while the copy allocates, another thread): "dictionary changed size
    during iteration" — then copy again."""
    for _ in range(100):
        try:
            return list(sys.modules.items())
        except RuntimeError:
            continue
    return list(sys.modules.copy().items())


def _module_file(module: ModuleType) -> str:
    path = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or ()), None)
    return os.path.abspath(path) if isinstance(path, str) else ""


def _import(path: str, module_name: str) -> ModuleType:
    """Execute inference.py as a fresh module; import failures name the file and line."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BundleError(f"{path} cannot be imported as Python source")
    module = importlib.util.module_from_spec(spec)
    # Registered before running so dataclasses, pickle and typing can find the module.
    sys.modules[module_name] = module
    try:
        with _IsolatedHelpers(os.path.dirname(path)):
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        where = f"{exc.filename or path}, line {exc.lineno}"
        code = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
        raise BundleError(
            f"{where}: {type(exc).__name__}: {exc.msg}{code} (while importing {path}); "
            "fix the code and start again"
        ) from exc
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        raise BundleError(_import_failure(path, exc)) from exc
    return module


def _import_failure(path: str, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    ours = [f for f in frames if os.path.abspath(f.filename) == path]
    where = f"{path}, line {ours[-1].lineno}" if ours else path
    deepest = frames[-1] if frames else None
    if deepest is not None and os.path.abspath(deepest.filename) != path:
        where += f" (raised in {deepest.filename}, line {deepest.lineno})"
    message = f"{where}: {type(exc).__name__}: {exc} while importing inference.py"
    if isinstance(exc, ModuleNotFoundError):
        code_dir = os.path.dirname(path)
        message += (
            f"; put the package in {os.path.join(code_dir, 'lib')} or list it in "
            f"{os.path.join(code_dir, 'requirements.txt')}"
        )
    return message


def install_requirements(
    code_dir: str, target_dir: str, *, timeout: float | None = 1800
) -> str | None:
    """pip-install code_dir/requirements.txt into target_dir and put that on sys.path.

    As in the container, a code/lib directory wins: requirements.txt is then ignored with a
    warning. A listed package that this process has already imported at another version is a
    BundleError naming it (shadowing.check_shadowed_imports), never a silent mismatch. Nothing is
    installed when this environment satisfies every requirement already (as the container's pip
    finds them installed), or when target_dir records the same requirements (and Python);
    a failed one is a BundleError with pip's last lines. Returns target_dir, or None.
    """
    requirements = os.path.abspath(os.path.join(code_dir, "requirements.txt"))
    if not os.path.isfile(requirements):
        return None
    if os.path.isdir(os.path.join(code_dir, "lib")):
        log.warning("loading modules from %s/lib, ignoring %s", code_dir, requirements)
        return None
    target = os.path.abspath(target_dir)
    with open(requirements, "rb") as f:
        content = f.read()
    digest = hashlib.sha256(content + sys.version.encode() + sys.executable.encode()).hexdigest()
    if _read(os.path.join(target, _MARKER)) != digest:
        present = satisfied_here(requirements)
        if present is None:
            _pip_install(requirements, target, digest, timeout)
        else:  # the container's pip would find them all installed, and install nothing
            log.info("%s: already satisfied here (%s); nothing to install", requirements, ", ".join(present) or "empty")
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, _MARKER), "w") as f:
                f.write(digest)
    else:
        log.info("packages from %s already installed in %s", requirements, target)
    with _IMPORT_LOCK:
        check_shadowed_imports(requirements, target)
        if target not in sys.path:
            sys.path.insert(0, target)  # until the handlers that use it are unloaded
    return target


def _pip_install(requirements: str, target: str, digest: str, timeout: float | None) -> None:
    """Install into a fresh directory beside target, then swap it in (no half-installed target)."""
    staging = f"{target}.installing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    command = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--target", staging, "-r", requirements,
    ]
    log.info("installing packages from %s into %s", requirements, target)
    try:
        done = subprocess.run(
            command, cwd=os.path.dirname(requirements), capture_output=True, text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        raise BundleError(
            f"pip install -r {requirements} did not finish in {timeout:.0f} s; check the "
            "network or index settings (PIP_INDEX_URL), or vendor the packages in code/lib"
        ) from None
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-15:])
        raise BundleError(
            f"pip could not install {requirements} (exit code {done.returncode}); fix the "
            f"requirements or vendor the packages in code/lib. pip said:\n{tail}"
        )
    with open(os.path.join(staging, _MARKER), "w") as f:
        f.write(digest)
    shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if _read(os.path.join(target, _MARKER)) != digest:  # not another process's same install
            raise BundleError(
                f"could not move the packages from {requirements} into {target}; "
                "check that the directory is writable and not in use"
            ) from None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def make_requests_response(
    status: int, body: bytes, content_type: str, url: str
) -> requests.Response:
    """A real requests.Response for an in-process answer, for output_handler(response, context).

    Built the way requests builds every response (HTTPAdapter.build_response over a urllib3
    response), so no private field of requests is written.
    """
    request = requests.PreparedRequest()
    request.method, request.url = "POST", url
    request.headers = CaseInsensitiveDict({"Content-Type": JSON})
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    raw = urllib3.HTTPResponse(
        body=io.BytesIO(body),
        headers={"Content-Type": content_type, "Content-Length": str(len(body))},
        status=status,
        reason=reason,
        preload_content=False,
        decode_content=False,
    )
    response = _ADAPTER.build_response(request, raw)
    response.elapsed = datetime.timedelta(0)
    _ = response.content  # read now: the answer is complete, and reads again come from memory
    return response


_ADAPTER = requests.adapters.HTTPAdapter()
