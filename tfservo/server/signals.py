"""A worker's SIGTERM and SIGINT taken by one thread of their own, never by a thread that runs a model.

TensorFlow 2.21 carries oneDNN 3.7, whose f32 GEMM kernels point the stack pointer into a heap
buffer while they run (any dense layer with more than ~84 inputs). The kernel writes a signal's
frame below the stack pointer of the thread it interrupts, so a signal handled on a thread inside
such a kernel overwrites the heap there, and the process aborts later ("free(): invalid pointer",
"corrupted size vs. prev_size"): oneDNN#4845, fixed in oneDNN 3.11.2, which no TensorFlow release
carries yet. Workers stopped with SIGTERM while they answered requests died this way about once
in fifteen stops; `tests/server/test_signals.py` makes it happen in a fraction of a second.

`route_signals()` blocks the signals in the calling thread (the worker's main thread, before it
starts any other), so every thread started from then on inherits the block: TensorFlow's pools,
the batch and call threads, the event loop itself. One thread of its own unblocks them and only
waits: the kernel delivers them there, on an ordinary stack. Python still runs the handlers in
the main thread (the C handler wakes it through the event loop's wakeup fd), so what a signal
does is unchanged.

Processes started from such a thread inherit the block too (exec keeps the signal mask): stop
them with SIGKILL (`Popen.kill`, `subprocess.run`'s timeout) or unblock the signals in them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable

__all__ = ["ROUTED_SIGNALS", "route_signals"]

ROUTED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)  # the ones a worker handles

_THREAD_NAME = "tfservo-signals"


def route_signals(signals: Iterable[signal.Signals] = ROUTED_SIGNALS) -> None:
    """Deliver `signals` to one thread that runs nothing; call it before starting other threads.
    A second call adds nothing."""
    wanted = set(signals)
    if any(thread.name == _THREAD_NAME for thread in threading.enumerate()):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    started = threading.Event()

    def receive() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)
        started.set()
        threading.Event().wait()  # the kernel interrupts this wait to run the C handler here

    threading.Thread(target=receive, name=_THREAD_NAME, daemon=True).start()
    started.wait()
