"""What the workflow examples share: run `tfservo serve` / `tfservo transform` as a user would
(the installed command, a subprocess), and wait for the server to answer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

TFSERVO = str(Path(sys.executable).with_name("tfservo"))
_READY = re.compile(r"serving .* on (https?://[^ ]+) ")
_GRPC = re.compile(r"gRPC on ([^ ]+)")


class Server:
    """A running `tfservo serve`: its URL, gRPC address and log lines."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.url = ""
        self.grpc = ""
        self.lines: list[str] = []


@contextmanager
def serving(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 180) -> Iterator[Server]:
    """`tfservo serve ARGS` on a free loopback port until the block ends (then SIGTERM)."""
    proc = subprocess.Popen(
        [TFSERVO, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", *args],
        env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    server = Server(proc)
    ready = threading.Event()

    def follow() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            server.lines.append(line)
            if m := _GRPC.search(line):
                server.grpc = m[1]
            if m := _READY.search(line):
                server.url = m[1]
                ready.set()

    threading.Thread(target=follow, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("tfservo serve did not start:\n" + "".join(server.lines))
    try:
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def tfservo(*args: str) -> None:
    """Run a tfservo command, its output shown; stop the example if it fails."""
    print("$ tfservo " + " ".join(args), flush=True)
    done = subprocess.run([TFSERVO, *args])
    if done.returncode != 0:
        raise SystemExit(f"tfservo {args[0]} failed with status {done.returncode}")


def quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfservo.core.logs import quiet_tensorflow as quiet

    quiet()
