"""Signals and oneDNN's GEMM kernels (server/signals.py): a process that runs a dense layer on
two threads while it takes thousands of handled signals — its heap corrupted within a fraction
of a second as TensorFlow 2.21 ships, intact once the signals are routed to their own thread."""

from __future__ import annotations

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


def signalled_run(model: Path, mode: str, seconds: float, script: Path) -> tuple[int, str, int]:
    """The child's exit status and output, and how many SIGUSR1s were sent to it while it ran."""
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
    limit = time.monotonic() + seconds + 60
    while child.poll() is None and time.monotonic() < limit:
        try:
            os.kill(child.pid, signal.SIGUSR1)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.0002)
    out = child.stdout.read()
    return child.wait(timeout=30), "".join(lines) + out, sent


def test_a_signal_taken_inside_a_gemm_corrupts_the_heap_without_routing(dense_model, tmp_path):
    # The upstream bug this module works around. When a TensorFlow release carries oneDNN 3.11.2
    # or later this test fails: the workaround in server/signals.py may then go.
    # A race: it corrupts within a fraction of a second as a rule, but on a loaded machine one
    # run of 8 s survived 21 249 signals; three runs tell a fixed oneDNN from bad luck.
    for _ in range(3):
        code, out, sent = signalled_run(dense_model, "plain", 8.0, tmp_path / "child.py")
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
