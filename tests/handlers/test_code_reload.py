"""`serve --reload` and `invoke --watch`: an edited handler answers without the model loading again."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

from conftest import SMC, write_code
from server_process import TFSERVO, ServerProcess, set_up

HANDLER = """
    from helper import label


    def handler(data, context):
        return f"{label()} {VERSION}: {data.read().decode().strip()}", "text/plain"
"""


def bundle(tmp_path):
    root = tmp_path / "model"
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000124", root / "00000124")
    write_code(root / "code", HANDLER.replace("{VERSION}", "v1"), {"lib/helper.py": "def label():\n    return 'one'\n"})
    return root


def edit(path, text: str) -> None:
    path.write_text(text)
    os.utime(path, None)


def answer_within(client, expected: str, seconds: float) -> float:
    started = time.monotonic()
    while True:
        body = client.post("/invocations", content=b"x", headers={"Content-Type": "text/plain"}).text
        if body == expected:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"still {body!r} after {seconds}s"
        time.sleep(0.05)


def loads(client) -> float:
    text = client.get("/metrics").text
    return sum(float(v) for v in re.findall(r'^tfservo_model_loads_total\{[^}]*\} ([0-9.e+]+)$', text, re.M))


def test_serve_reload_answers_with_the_edited_handler_and_keeps_the_model(tmp_path):
    root = bundle(tmp_path)
    code = root / "code"
    with ServerProcess([str(root), "--reload"]) as server, server.client() as client:
        assert client.post("/invocations", content=b"x", headers={"Content-Type": "text/plain"}).text == "one v1: x"
        loaded = loads(client)
        assert loaded == 1
        edit(code / "inference.py", (code / "inference.py").read_text().replace("v1", "v2"))
        assert answer_within(client, "one v2: x", 2.0) < 2.0
        edit(code / "lib" / "helper.py", "def label():\n    return 'two'\n")  # a helper module in lib/
        answer_within(client, "two v2: x", 2.0)
        edit(code / "inference.py", "def handler(data, context)\n    return 'broken'\n")  # a syntax error
        deadline = time.monotonic() + 5
        while "not reloaded" not in server.output and time.monotonic() < deadline:
            time.sleep(0.1)
        assert re.search(r"not reloaded.*inference\.py, line 1: SyntaxError", server.output), server.output
        assert client.post("/invocations", content=b"x", headers={"Content-Type": "text/plain"}).text == "two v2: x"
        assert loads(client) == loaded  # no model was loaded again


def test_invoke_watch_runs_the_request_again_after_each_edit(tmp_path):
    root = bundle(tmp_path)
    log = open(tmp_path / "invoke.log", "w")  # a file, not an unread pipe that could fill up
    proc = subprocess.Popen(set_up([TFSERVO, "invoke", str(root), "--content-type", "text/plain", "--watch"], ctrl_c=True),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        proc.stdin.write("hello")
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "one v1: hello"
        time.sleep(0.5)  # the watcher is up
        edit(root / "code" / "inference.py", (root / "code" / "inference.py").read_text().replace("v1", "v2"))
        assert proc.stdout.readline().strip() == "one v2: hello"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            log.close()
