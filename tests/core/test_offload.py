"""core.offload with a real child process: items arrive in order, a flush waits for them, the
child's messages come back, and a child that dies makes `add` say its items are dropped."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tfservo.core.offload import Offload


class Recorder:
    """The child's work: each item appended to a file, a count sent back per batch."""

    def __init__(self, reply, path: str) -> None:
        self.reply, self.path = reply, path

    def handle(self, batch: list) -> None:
        with open(self.path, "a") as f:
            f.writelines(f"{item}\n" for item in batch)
        self.reply(("handled", len(batch), os.getpid()))

    def close(self) -> None:
        with open(self.path, "a") as f:
            f.write("closed\n")


def test_items_reach_the_child_in_order_and_a_flush_waits_for_them(tmp_path: Path) -> None:
    out = tmp_path / "items.txt"
    messages: list[tuple] = []
    offload = Offload(Recorder, (str(out),), name="test-offload", delay=60, max_queue=1000, batch=10_000,
                      on_message=messages.append)
    try:
        assert all(offload.add(i) for i in range(250))
        assert offload.flush(30)  # the delay is a minute: only the flush sent them
        assert out.read_text().split() == [str(i) for i in range(250)]
        assert sum(m[1] for m in messages) == 250 and messages[0][2] == offload.process.pid != os.getpid()
    finally:
        offload.close()
    assert out.read_text().split()[-1] == "closed" and offload.process.poll() == 0


def test_a_full_queue_and_a_dead_child_drop_items(tmp_path: Path) -> None:
    offload = Offload(Recorder, (str(tmp_path / "items.txt"),), name="test-offload", delay=60, max_queue=3,
                      batch=10_000)
    try:
        assert [offload.add(i) for i in range(4)] == [True, True, True, False]
        offload.process.kill()
        deadline = time.monotonic() + 10
        while offload.add("after") and time.monotonic() < deadline:
            offload.flush(0.5)  # sends what is held, into a pipe nobody reads
            time.sleep(0.1)
        assert not offload.add("after")
        assert not offload.flush(1)
    finally:
        offload.close(1)


class Logger:
    """The child's work: logs each batch, a debug line (below the parent's level) and a warning
    from a thread of its own."""

    def __init__(self, reply) -> None:
        pass

    def handle(self, batch: list) -> None:
        import logging
        import threading

        log = logging.getLogger("tfservo.test")
        log.debug("not wanted: %s", batch)
        thread = threading.Thread(target=log.warning, args=("child says %s", batch))
        thread.start()
        thread.join()
        raise ValueError("a bug in the work")

    def close(self) -> None:
        pass


def test_the_childs_log_records_are_written_by_the_parents_logging(caplog) -> None:
    caplog.set_level("INFO", logger="tfservo")
    offload = Offload(Logger, (), name="test-offload", delay=60, max_queue=10, batch=10_000)
    try:
        offload.add("x")
        assert offload.flush(30)
    finally:
        offload.close()
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert ("tfservo.test", "WARNING", "child says ['x']") in records
    assert not [r for r in records if "not wanted" in r[2]]
    failed = [r for r in records if r[2].startswith("handling a batch failed")]
    assert failed and failed[0][:2] == ("tfservo", "ERROR") and "ValueError: a bug in the work" in failed[0][2]
