"""Where the server runs request work: inline on the event loop only when it is small and quick."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from tfservo.service.call_placement import INLINE_BODY_BYTES, CallPlacement

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="unset")


def _where() -> tuple[str, str]:
    return threading.current_thread().name, _var.get()


@pytest.fixture
def placement():
    p = CallPlacement(4, "test-call")
    yield p
    p.close()


def test_quick_small_calls_move_onto_the_loop_after_their_first_call(placement: CallPlacement) -> None:
    async def main() -> list[tuple[str, str]]:
        _var.set("request")
        return [await placement.run("quick", 100, _where) for _ in range(3)]

    first, second, third = asyncio.run(main())
    assert first[0].startswith("test-call")  # nothing known yet: a worker thread
    assert second[0] == third[0] == threading.current_thread().name  # then inline, on the loop
    assert first[1] == second[1] == "request"  # the caller's context either way


def test_slow_large_and_non_inlinable_calls_stay_in_threads(placement: CallPlacement) -> None:
    def slow() -> tuple[str, str]:
        time.sleep(0.005)
        return _where()

    async def main() -> list[str]:
        names = [(await placement.run("slow", 100, slow))[0] for _ in range(3)]
        await placement.run("quick", 100, _where)
        names.append((await placement.run("quick", INLINE_BODY_BYTES + 1, _where))[0])
        names.append((await placement.run("quick", 100, _where, may_inline=False))[0])
        return names

    assert all(name.startswith("test-call") for name in asyncio.run(main()))
    assert placement.estimate("slow") >= 0.005


def test_a_kind_costs_its_quickest_recent_call(placement: CallPlacement) -> None:
    async def main() -> None:
        await placement.run("k", 0, lambda: time.sleep(0.004))
        await placement.run("k", 0, lambda: None)
        assert placement.estimate("k") < 0.001
        await placement.run("k", 0, lambda: time.sleep(0.02))  # one slow call among quick ones
        assert placement.estimate("k") < 0.002
        for _ in range(8):  # only slow ones of late: slow
            await placement.run("k", 0, lambda: time.sleep(0.002))
        assert placement.estimate("k") >= 0.002

    asyncio.run(main())


def test_inline_off_never_runs_on_the_loop() -> None:
    placement = CallPlacement(2, "test-off", inline=False)

    async def main() -> list[str]:
        return [(await placement.run("quick", 0, _where))[0] for _ in range(3)]

    try:
        assert all(name.startswith("test-off") for name in asyncio.run(main()))
    finally:
        placement.close()
