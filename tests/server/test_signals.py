"""Signals and oneDNN's GEMM kernels (server/signals.py): a process that runs a dense layer on
two threads while it takes thousands of handled signals — its heap corrupted within a fraction
of a second as TensorFlow 2.21 ships, intact once the signals are routed to their own thread."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

# Runs the model on its main thread and one more, counting SIGUSR1s, for argv[3] seconds.
CHILD = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    import numpy as np
    from tfservo.models.savedmodel import load_saved_model
    from tfservo.server.signals import route_signals

    handled = 0

    def count(sig, frame):
        global handled
        handled += 1

    signal.signal(signal.SIGUSR1, count)
    if sys.argv[2] == "routed":
        route_signals([signal.SIGUSR1])
    model = load_saved_model(sys.argv[1])
    rows = [np.random.rand(n, 784).astype(np.float32) for n in (1, 8, 32, 64)]
    deadline = time.monotonic() + float(sys.argv[3])

    def work():
        while time.monotonic() < deadline:
            model.run("serving_default", {"x": random.choice(rows)})

    other = threading.Thread(target=work)
    other.start()
    print("ready", flush=True)
    work()
    other.join()
    print("handled", handled, flush=True)
    os._exit(0)
""")

_LIBC = ctypes.CDLL(None)  # tgkill: a signal to one thread of another process (glibc 2.30)


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory) -> Path:
    """relu(x W + b) with x of 784 values: K=784 takes oneDNN's kernel onto its heap workspace."""

    class Dense(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            rng = np.random.default_rng(0)
            self.w = tf.Variable(rng.normal(size=(784, 256)).astype(np.float32))
            self.b = tf.Variable(np.zeros(256, np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.nn.relu(x @ self.w + self.b)}

    module = Dense()
    path = tmp_path_factory.mktemp("dense") / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve.get_concrete_function()})
    return path


def signalled_run(
    model: Path, mode: str, seconds: float, script: Path, *, every_thread: bool = False
) -> tuple[int, str, int]:
    """The child's exit status and output, and how many SIGUSR1s were sent to it while it ran:
    to the process, as `kill` sends them, or with `every_thread` to each of its threads in turn."""
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(model), mode, str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert child.stdout is not None
    lines = []
    while "ready" not in (line := child.stdout.readline()):
        assert line, "".join(lines)
        lines.append(line)
    sent = 0
    threads: list[int] = []
    limit = time.monotonic() + seconds + 60
    while child.poll() is None and time.monotonic() < limit:
        try:
            if not every_thread:
                os.kill(child.pid, signal.SIGUSR1)
                sent += 1
            else:
                if sent % 256 == 0:  # TensorFlow starts its pools' threads lazily
                    threads = [int(tid) for tid in os.listdir(f"/proc/{child.pid}/task")]
                for tid in threads:
                    _LIBC.tgkill(child.pid, tid, signal.SIGUSR1)
                    sent += 1
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.0002)
    out = child.stdout.read()
    return child.wait(timeout=30), "".join(lines) + out, sent


def test_a_signal_taken_inside_a_gemm_corrupts_the_heap_without_routing(dense_model, tmp_path):
    # The upstream bug this module works around. When a TensorFlow release carries oneDNN 3.11.2
    # or later this test fails: the workaround in server/signals.py may then go.
    # A race whose odds are set once per process: a process either corrupts within a second or
    # two or survives every signal (about half of them did, with signals sent to the process, and
    # CI once saw three such in a row). Sent to every thread, 30 of 32 processes corrupted, 8 of
    # 10 with the machine's cores busy; ten processes tell a fixed oneDNN from bad luck.
    for _ in range(10):
        code, out, sent = signalled_run(dense_model, "plain", 4.0, tmp_path / "child.py", every_thread=True)
        if code != 0:
            break
    assert code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS), (
        f"the process survived {sent} signals (exit {code}): does this TensorFlow's oneDNN carry the fix "
        f"of oneDNN#4845? Then server/signals.py is no longer needed.\n{out[-2000:]}"
    )


def test_routed_signals_leave_the_heap_intact(dense_model, tmp_path):
    code, out, sent = signalled_run(dense_model, "routed", 4.0, tmp_path / "child.py")
    assert code == 0, f"exit {code} after {sent} signals:\n{out[-2000:]}"
    handled = int(out.split("handled")[-1])
    assert handled > 100 and sent > 1000, (handled, sent)  # the handler still runs, in the main thread
