"""inference.py loading and the handler flows, as the container's python_service runs them."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from conftest import write_code

from tfservo.core.errors import BundleError, HandlerError, InvalidArgument
from tfservo.handlers import bundle_code as handlers_module
from tfservo.handlers.bundle_code import (
    Context,
    Handlers,
    install_requirements,
    load_handlers,
    make_requests_response,
)

URI = "http://127.0.0.1:8080/v1/models/half_plus_three:predict"


@pytest.fixture(autouse=True)
def restore_sys_path():
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = saved_path
    for name in set(sys.modules) - saved_modules:
        del sys.modules[name]


def load(code_dir: Path, name: str = "t_inference") -> Handlers:
    handlers = load_handlers(str(code_dir), module_name=name)
    assert handlers is not None
    return handlers


def make_context(**overrides) -> Context:
    fields = dict(
        model_name="half_plus_three",
        model_version=None,
        method="predict",
        rest_uri=URI,
        grpc_port=9000,
        channel=None,
        custom_attributes="tfs-model-name=half_plus_three",
        request_content_type="application/json",
        accept_header="application/json",
        content_length=10,
    )
    fields.update(overrides)
    return Context(**fields)


class FakeTFS:
    """A tfs_call that answers half_plus_three and records what it was sent."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.sent: list[bytes | str] = []

    def __call__(self, body: bytes | str, context: Context) -> requests.Response:
        self.sent.append(body)
        if self.status != 200:
            error = b'{"error": "JSON Parse error: The document is empty"}'
            return make_requests_response(self.status, error, "application/json", context.rest_uri)
        xs = json.loads(body)["instances"]
        answer = json.dumps({"predictions": [x / 2 + 3 for x in xs]}).encode()
        return make_requests_response(200, answer, "application/json", context.rest_uri)


def no_tfs(body, context):
    raise AssertionError("handler() flows must not call tfs_call")


# -- Context ----------------------------------------------------------------------------------


def test_context_has_the_container_fields_in_order():
    assert Context._fields[:10] == (
        "model_name",
        "model_version",
        "method",
        "rest_uri",
        "grpc_port",
        "channel",
        "custom_attributes",
        "request_content_type",
        "accept_header",
        "content_length",
    )
    context = make_context(grpc_uri="127.0.0.1:9000")
    assert context.grpc_uri == "127.0.0.1:9000"
    assert context[3] == URI
    assert make_context().grpc_uri is None


# -- loading ----------------------------------------------------------------------------------


def test_no_inference_py_is_none(tmp_path):
    assert load_handlers(str(tmp_path), module_name="t_none") is None


def test_handler_gets_a_stream_and_context(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import json

        def handler(data, context):
            payload = json.loads(data.read().decode("utf-8"))
            echo = {"got": payload, "model": context.model_name, "accept": context.accept_header,
                    "length": context.content_length, "uri": context.rest_uri}
            return json.dumps(echo), "application/json"
        """,
    )
    handlers = load(code)
    assert handlers.handler is not None and handlers.input_handler is None
    body, content_type, _ = handlers.call(b'{"a": 1}', make_context(), no_tfs)
    assert content_type == "application/json"
    assert json.loads(body) == {
        "got": {"a": 1},
        "model": "half_plus_three",
        "accept": "application/json",
        "length": 10,
        "uri": URI,
    }
    # a stream is taken as given (what the lead's invoker passes)
    body, _, _ = handlers.call(io.BytesIO(b"[2]"), make_context(), no_tfs)
    assert json.loads(body)["got"] == [2]


def test_input_output_handlers_flow(tmp_path):
    # like the container's test/resources/examples input/output handler scripts
    code = write_code(
        tmp_path / "code",
        """
        import json

        def input_handler(data, context):
            if context.request_content_type == "text/csv":
                values = [float(x) for x in data.read().decode("utf-8").split(",")]
                return json.dumps({"instances": values})
            raise ValueError("unsupported content type {}".format(context.request_content_type))

        def output_handler(response, context):
            if response.status_code != 200:
                raise ValueError(response.content.decode("utf-8"))
            return response.content, context.accept_header
        """,
    )
    handlers = load(code)
    tfs = FakeTFS()
    context = make_context(request_content_type="text/csv", accept_header="application/json")
    body, content_type, _ = handlers.call(b"1.0,2.0,5.0", context, tfs)
    assert json.loads(body) == {"predictions": [3.5, 4.0, 5.5]}
    assert content_type == "application/json"
    assert tfs.sent == ['{"instances": [1.0, 2.0, 5.0]}']

    with pytest.raises(HandlerError) as err:
        handlers.call(b"abc", make_context(request_content_type="image/png"), tfs)
    assert err.value.message == "unsupported content type image/png"
    assert err.value.code.name == "INTERNAL"
    assert isinstance(err.value.__cause__, ValueError)


def test_output_handler_sees_tfs_errors(tmp_path):
    # the container's test_zero_content: TF Serving's 400 becomes the handler's 500 message
    code = write_code(
        tmp_path / "code",
        """
        def input_handler(data, context):
            return data.read().decode("utf-8")

        def output_handler(response, context):
            if response.status_code != 200:
                raise ValueError(response.content.decode("utf-8"))
            return response.content, "application/json"
        """,
    )
    with pytest.raises(HandlerError, match="document is empty"):
        load(code).call(b"", make_context(), FakeTFS(status=400))


def test_input_handler_return_types(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import io

        def input_handler(data, context):
            kind = data.read().decode()
            return {
                "str": '{"instances": [1]}',
                "bytes": b'{"instances": [1]}',
                "bytearray": bytearray(b'{"instances": [1]}'),
                "dict": {"instances": [1]},
                "file": io.BytesIO(b'{"instances": [1]}'),
                "none": None,
                "int": 5,
                "unserializable": {"instances": [object()]},
            }[kind]

        def output_handler(response, context):
            return response.text
        """,
    )
    handlers = load(code)
    for kind, expected in [
        ("str", '{"instances": [1]}'),
        ("bytes", b'{"instances": [1]}'),
        ("bytearray", b'{"instances": [1]}'),
        ("dict", b'{"instances":[1]}'),
        ("file", b'{"instances": [1]}'),
        ("none", b""),
    ]:
        sent = []

        def tfs(body, context, sent=sent):
            sent.append(body)
            return make_requests_response(200, b"{}", "application/json", context.rest_uri)

        assert handlers.call(kind.encode(), make_context(), tfs) == (b"{}", "application/json", None)
        assert sent == [expected], kind
    with pytest.raises(HandlerError, match="returned int"):
        handlers.call(b"int", make_context(), no_tfs)
    with pytest.raises(HandlerError, match="not JSON-serializable"):
        handlers.call(b"unserializable", make_context(), no_tfs)


def test_handler_return_conventions(tmp_path, caplog):
    code = write_code(
        tmp_path / "code",
        """
        def handler(data, context):
            kind = data.read().decode()
            return {
                "tuple": ("body", "text/plain"),
                "list": [b"body", "text/plain"],
                "bytes": b"body",
                "str": "body",
                "none": None,
                "none-type": ("body", None),
                "accept": ("body", context.accept_header),
                "dict": {"a": 1},
                "triple": ("a", "b", "c"),
                "quadruple": ("a", "b", "c", "d"),
                "bad-attributes": ("a", "b", {"c": 1}),
                "bad-type": ("body", 5),
                "zip": zip(["a"], [1]),
            }[kind]
        """,
    )
    handlers = load(code)
    call = lambda kind, **kw: handlers.call(kind.encode(), make_context(**kw), no_tfs)
    assert call("tuple") == (b"body", "text/plain", None)
    assert call("list") == (b"body", "text/plain", None)
    assert call("bytes") == (b"body", "application/json", None)
    assert call("str") == (b"body", "application/json", None)
    assert call("none") == (b"", "application/json", None)
    assert call("none-type") == (b"body", "application/json", None)
    assert call("accept", accept_header="*/*") == (b"body", "*/*", None)
    assert call("triple") == (b"a", "b", "c")  # custom attributes for the answer
    with pytest.raises(HandlerError, match="body of type dict"):
        call("dict")
    with pytest.raises(HandlerError, match="tuple of 4 items"):
        call("quadruple")
    with pytest.raises(HandlerError, match="custom attributes"):
        call("bad-attributes")
    with pytest.raises(HandlerError, match="content type 5"):
        call("bad-type")
    with caplog.at_level(logging.ERROR, logger="tfservo.handlers"):
        with pytest.raises(HandlerError, match=r"body of type zip \(an iterator\): return json.dumps\(list"):
            call("zip")
    assert "returned a body of type zip" in caplog.text  # the log says what the answer says


def test_handler_exception_message_is_the_users(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import sys

        def handler(data, context):
            kind = data.read()
            if kind == b"exit":
                sys.exit(3)
            raise KeyError("missing")
        """,
    )
    handlers = load(code)
    with pytest.raises(HandlerError) as err:
        handlers.call(b"x", make_context(), no_tfs)
    assert err.value.message == "'missing'"  # str(KeyError), exactly as the container answers
    assert "inference.py" in err.value.user_traceback
    with pytest.raises(HandlerError):
        handlers.call(b"exit", make_context(), no_tfs)


def test_tfs_call_errors_pass_through(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        def input_handler(data, context):
            return data.read()

        def output_handler(response, context):
            return response.content
        """,
    )

    def failing(body, context):
        raise InvalidArgument("no such model")

    with pytest.raises(InvalidArgument, match="no such model"):
        load(code).call(b"{}", make_context(), failing)


def test_handler_wins_over_the_pair(tmp_path, caplog):
    code = write_code(
        tmp_path / "code",
        """
        def handler(data, context):
            return "from handler", "text/plain"

        def input_handler(data, context):
            raise AssertionError

        def output_handler(response, context):
            raise AssertionError
        """,
    )
    handlers = load(code)
    assert handlers.call(b"", make_context(), no_tfs) == (b"from handler", "text/plain", None)
    assert "not used" in caplog.text


@pytest.mark.parametrize(
    "present, missing",
    [("input_handler", "output_handler"), ("output_handler", "input_handler")],
)
def test_only_one_of_the_pair_is_an_error(tmp_path, present, missing):
    code = write_code(tmp_path / "code", f"def {present}(a, b):\n    return a\n")
    with pytest.raises(BundleError) as err:
        load(code)
    assert f"defines {present} but not {missing}" in err.value.message
    assert str(code / "inference.py") in err.value.message


def test_no_handlers_is_an_error(tmp_path):
    code = write_code(tmp_path / "code", "x = 1\nhandler = 'not a function'\n")
    with pytest.raises(BundleError, match="not a function"):
        load(code)
    write_code(tmp_path / "code", "x = 1\n")
    with pytest.raises(BundleError, match="defines no handlers"):
        load(code)


def test_syntax_error_names_file_and_line(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import json


        def handler(data context):
            return data
        """,
    )
    with pytest.raises(BundleError) as err:
        load(code, "t_syntax")
    message = err.value.message
    assert f"{code / 'inference.py'}, line 5" in message
    assert "SyntaxError" in message and "def handler(data context):" in message
    assert "t_syntax" not in sys.modules


def test_runtime_error_on_import_names_file_and_line(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import os

        CONFIG = {"a": 1}
        VALUE = CONFIG["b"]

        def handler(data, context):
            return data
        """,
    )
    with pytest.raises(BundleError) as err:
        load(code, "t_runtime")
    message = err.value.message
    assert f"{code / 'inference.py'}, line 5" in message
    assert "KeyError: 'b'" in message


def test_error_raised_inside_a_lib_module_names_both(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        import broken_helper

        def handler(data, context):
            return data
        """,
        {"lib/broken_helper.py": "x = 1\nraise RuntimeError('helper failed')\n"},
    )
    with pytest.raises(BundleError) as err:
        load(code, "t_lib_broken")
    message = err.value.message
    assert f"{code / 'inference.py'}, line 2" in message
    assert "broken_helper.py, line 2" in message and "helper failed" in message


def test_missing_module_suggests_lib_or_requirements(tmp_path):
    code = write_code(tmp_path / "code", "import surely_not_installed_pkg_x\n")
    with pytest.raises(BundleError) as err:
        load(code, "t_missing")
    message = err.value.message
    assert "ModuleNotFoundError" in message and "line 1" in message
    assert "requirements.txt" in message and str(code / "lib") in message


def test_lib_and_code_dir_are_importable(tmp_path):
    code = write_code(
        tmp_path / "code",
        """
        from dataclasses import dataclass

        import helper_in_code
        from libpkg.util import shout

        @dataclass
        class Thing:
            name: str

        def handler(data, context):
            return shout(helper_in_code.NAME + Thing(data.read().decode()).name), "text/plain"
        """,
        {
            "helper_in_code.py": "NAME = 'code:'\n",
            "lib/libpkg/__init__.py": "",
            "lib/libpkg/util.py": "def shout(s):\n    return s.upper()\n",
        },
    )
    handlers = load(code, "t_lib_ok")
    assert handlers.call(b"hi", make_context(), no_tfs) == (b"CODE:HI", "text/plain", None)
    lib, code_dir = str(code / "lib"), str(code)
    assert sys.path.index(lib) < sys.path.index(code_dir)  # the container's order
    assert sys.modules["t_lib_ok"] is handlers.module


def test_two_bundles_inference_modules_do_not_clash(tmp_path):
    first = write_code(tmp_path / "one", "def handler(d, c):\n    return 'one'\n")
    second = write_code(tmp_path / "two", "def handler(d, c):\n    return 'two'\n")
    h1, h2 = load(first, "t_model_one"), load(second, "t_model_two")
    assert h1.call(b"", make_context(), no_tfs)[0] == b"one"
    assert h2.call(b"", make_context(), no_tfs)[0] == b"two"
    assert h1.module is not h2.module


def test_two_bundles_helper_modules_of_the_same_name_do_not_clash(tmp_path):
    source = """
        import shared_helper
        from shared_pkg.names import WHO

        def handler(data, context):
            return shared_helper.NAME + "/" + WHO, "text/plain"
        """
    handlers = []
    for name in ("alpha", "beta"):
        code = write_code(
            tmp_path / name / "code",
            source,
            {
                "shared_helper.py": f"NAME = '{name}'\n",
                "lib/shared_pkg/__init__.py": "",
                "lib/shared_pkg/names.py": f"WHO = '{name}-pkg'\n",
            },
        )
        handlers.append(load(code, f"t_helpers_{name}"))
    alpha, beta = handlers
    assert alpha.call(b"", make_context(), no_tfs)[0] == b"alpha/alpha-pkg"
    assert beta.call(b"", make_context(), no_tfs)[0] == b"beta/beta-pkg"


# -- requirements.txt -------------------------------------------------------------------------


def test_requirements_install_into_target_and_skip_when_unchanged(tmp_path, monkeypatch):
    from conftest import write_wheel

    code = tmp_path / "code"
    code.mkdir()
    write_wheel(code, "tfservo-probe", "1.0", {"tfservo_probe.py": "VERSION = '1.0'\n"})
    (code / "requirements.txt").write_text("--no-index\n--find-links .\ntfservo-probe==1.0\n")
    target = tmp_path / "deps" / "bundle"
    assert install_requirements(str(code), str(target)) == str(target)
    assert (target / "tfservo_probe.py").is_file()
    assert str(target) in sys.path
    probe = subprocess.run(
        [sys.executable, "-c", "import tfservo_probe; print(tfservo_probe.__file__)"],
        env={**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip().startswith(str(target))

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run again for the same requirements")

    monkeypatch.setattr(handlers_module.subprocess, "run", no_pip)
    assert install_requirements(str(code), str(target)) == str(target)


def test_changed_requirements_reinstall(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("tfservo-probe-a\n")  # not installed here: pip runs
    target = tmp_path / "deps"
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        staging = command[command.index("--target") + 1]
        Path(staging, "marker_pkg.py").write_text(f"N = {len(calls)}\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(handlers_module.subprocess, "run", fake_pip)
    install_requirements(str(code), str(target))
    install_requirements(str(code), str(target))
    assert len(calls) == 1
    assert calls[0][:3] == [sys.executable, "-m", "pip"]
    (code / "requirements.txt").write_text("tfservo-probe-a\ntfservo-probe-b\n")
    install_requirements(str(code), str(target))
    assert len(calls) == 2
    assert (target / "marker_pkg.py").read_text() == "N = 2\n"
    assert not list(tmp_path.glob("deps.installing-*"))


def test_failed_install_names_requirements_and_pip_output(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("./no-such-local-package-dir\n")
    target = tmp_path / "deps"
    with pytest.raises(BundleError) as err:
        install_requirements(str(code), str(target))
    message = err.value.message
    assert str(code / "requirements.txt") in message
    assert "no-such-local-package-dir" in message
    assert not target.exists()


def test_lib_wins_over_requirements(tmp_path, caplog, monkeypatch):
    code = tmp_path / "code"
    (code / "lib").mkdir(parents=True)
    (code / "requirements.txt").write_text("six\n")
    monkeypatch.setattr(handlers_module.subprocess, "run", None)
    assert install_requirements(str(code), str(tmp_path / "deps")) is None
    assert "ignoring" in caplog.text


def test_comment_only_requirements_install_nothing(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("# nothing needed\n")
    target = tmp_path / "deps"
    assert install_requirements(str(code), str(target)) == str(target)
    assert (target / ".tfservo-requirements").is_file()


def test_no_requirements_is_none(tmp_path):
    assert install_requirements(str(tmp_path), str(tmp_path / "deps")) is None


# -- requests.Response ------------------------------------------------------------------------


def test_make_requests_response_behaves_like_a_real_one():
    body = '{"predictions": [3.5, "é"]}'.encode()
    response = make_requests_response(200, body, "application/json", URI)
    assert isinstance(response, requests.Response)
    assert response.status_code == 200 and response.ok and response.reason == "OK"
    assert response.content == body
    assert response.text == '{"predictions": [3.5, "é"]}'
    assert response.json() == {"predictions": [3.5, "é"]}
    assert response.headers["content-type"] == "application/json"
    assert response.url == URI
    assert response.request.method == "POST"
    assert b"".join(response.iter_content(4)) == body
    response.raise_for_status()


def test_make_requests_response_error_status():
    response = make_requests_response(400, b'{"error": "bad"}', "application/json", URI)
    assert not response.ok and response.reason == "Bad Request"
    with pytest.raises(requests.HTTPError, match="400"):
        response.raise_for_status()
    odd = make_requests_response(599, b"", "application/json", "not a url")
    assert odd.status_code == 599 and odd.reason == ""


def test_requirements_the_server_satisfies_are_not_installed_and_others_must_not_shadow(tmp_path, caplog):
    """`Pillow>=6.2` (the container's own example bundles): the server's Pillow satisfies it, so
    nothing is installed and the bundle gets it; `Pillow==99.0` with Pillow already imported is a
    BundleError naming both versions."""
    import logging

    import PIL
    from conftest import write_wheel

    code = tmp_path / "code"
    code.mkdir()
    write_wheel(code, "pillow", "99.0", {"PIL/__init__.py": "__version__ = '99.0'\n"})
    (code / "requirements.txt").write_text("--no-index\n--find-links .\nPillow>=6.2\nsix\n")
    target = tmp_path / "deps"
    caplog.set_level(logging.INFO, logger="tfservo.handlers")
    try:
        # what pip would find installed is not installed again (no index needed), as in the container
        assert install_requirements(str(code), str(target)) == str(target)
        assert f"already satisfied here (Pillow {PIL.__version__}, six 1.17.0)" in caplog.text
        assert not (target / "PIL").exists()
        (code / "requirements.txt").write_text("--no-index\n--find-links .\nPillow>=6.2\nsix==1.0\n")
        with pytest.raises(BundleError, match="pip could not install"):  # six 1.0 is not here: pip runs
            install_requirements(str(code), str(tmp_path / "deps1"))
        (code / "requirements.txt").write_text("--no-index\n--find-links .\nPillow==99.0\n")
        with pytest.raises(BundleError, match=f"installs pillow 99.0, but pillow {PIL.__version__} is already imported"):
            install_requirements(str(code), str(tmp_path / "deps2"))
    finally:
        for path in (str(target), str(tmp_path / "deps2")):
            while path in sys.path:
                sys.path.remove(path)
