"""The poll after an answer (tfservo.http.idle_poll) on a real uvloop loop: it keeps the loop
busy for its window, stops when a request arrives, and its window follows how far apart
requests come."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from tfservo.http.idle_poll import IdlePoll

MOST = 0.1  # seconds: long beside a loop turn, so that "soon" and "late" are unambiguous


@pytest.fixture
def loop():
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


def _cpu_seconds_while(loop: asyncio.AbstractEventLoop, seconds: float) -> float:
    """This thread's CPU time while `loop` runs `seconds` with nothing to do but what is scheduled."""
    start = time.thread_time()
    loop.run_until_complete(asyncio.sleep(seconds))
    return time.thread_time() - start


def test_the_loop_polls_for_the_window_after_an_answer(loop):
    poll = IdlePoll(loop, 0.2)
    idle = _cpu_seconds_while(loop, 0.3)
    poll.answered()
    polled = _cpu_seconds_while(loop, 0.3)
    assert idle < 0.02
    assert polled > 0.04  # busy for its 0.2 s window (less if the machine is busy), not asleep


def test_a_request_ends_the_poll(loop):
    poll = IdlePoll(loop, 0.2)
    poll.answered()
    poll.arrived()
    assert _cpu_seconds_while(loop, 0.3) < 0.02
    assert poll.window == 0.2


def test_requests_further_apart_than_the_most_turn_polling_off(loop):
    poll = IdlePoll(loop, MOST)
    windows = []
    for _ in range(4):
        poll.answered()
        loop.run_until_complete(asyncio.sleep(2.5 * MOST))
        poll.arrived()
        windows.append(poll.window)
    assert windows == [MOST / 2, MOST / 4, MOST / 8, 0.0]
    poll.answered()
    assert _cpu_seconds_while(loop, 0.2) < 0.02  # off: an answer no longer polls


def test_requests_that_come_soon_after_a_poll_gave_up_lengthen_it_again(loop):
    poll = IdlePoll(loop, MOST)
    for _ in range(4):  # off, as above
        poll.answered()
        loop.run_until_complete(asyncio.sleep(2.5 * MOST))
        poll.arrived()
    windows = []
    for _ in range(5):
        poll.answered()
        # past the window (at most MOST / 2 here), within the most
        loop.run_until_complete(asyncio.sleep(0 if not poll.window else MOST * 0.6))
        poll.arrived()
        windows.append(poll.window)
    assert windows == [MOST / 8, MOST / 4, MOST / 2, MOST, MOST]
