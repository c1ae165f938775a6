"""Predicts queued from an event loop (QueuedCalls), with the real TF Serving API and batcher: a
call runs on the loop only when its own signature's batches have been quick, the calls of one
loop turn run there as one batch, and a call refused before it ran gives its model version
back."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfservo.core.errors import Overloaded
from tfservo.core.settings import resolve_settings
from tfservo.service.call_placement import CallPlacement
from tfservo.service.factory import build_service
from tfservo.service.queued_calls import QueuedCalls

KIND = ("two_speeds", "predict")


def _thread_of(values: np.ndarray) -> np.ndarray:
    return np.full(values.shape, threading.get_ident(), np.int64)


def _slowly_thread_of(values: np.ndarray) -> np.ndarray:
    time.sleep(0.01)
    return _thread_of(values)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    """A model whose `serving_default` answers at once and whose `slow` signature takes 10 ms,
    each answering the thread its op ran in (numpy_functions: it loads in this process only)."""
    root = tmp_path_factory.mktemp("speeds") / "two_speeds"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        quick = tf.numpy_function(_thread_of, [x], tf.int64)
        slow = tf.numpy_function(_slowly_thread_of, [x], tf.int64)
        rows = tf.fill(tf.shape(x), tf.size(x, out_type=tf.int64))
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(str(root / "1"))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"thread": quick}),
                "slow": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"thread": slow}),
                "sized": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"thread": quick, "rows": rows}),
            })
            builder.save()
    service = build_service(resolve_settings(paths=[str(root)], multi_model=False, env={}))  # serve's defaults
    assert service.batches
    yield service
    service.close()


def _predict(queue: QueuedCalls, placement: CallPlacement, signature: str, rows: int = 1):
    api = queue.api
    body = json.dumps({"signature_name": signature, "instances": [1.0] * rows}).encode()

    def prepare():
        return (*api.decode("predict", "two_speeds", None, None, body), api.encode_rest)

    return queue.run(placement, KIND, "two_speeds", len(body), prepare)


def test_a_call_runs_on_the_loop_only_when_its_own_signature_has_been_quick(service) -> None:
    placement = CallPlacement(4, "test-call")
    queue = QueuedCalls(service.api, batched=True)

    async def thread_of(signature: str) -> int:
        return int(json.loads(await _predict(queue, placement, signature))["predictions"][0])

    async def main() -> tuple[int, list[int], list[int]]:
        loop_thread = threading.get_ident()
        quick = [await thread_of("serving_default")]
        while quick[-1] != loop_thread and len(quick) < 50:  # until known to be quick (first calls are slower)
            quick.append(await thread_of("serving_default"))
        return loop_thread, quick, [await thread_of("slow"), await thread_of("slow")]

    try:
        loop_thread, quick, slow = asyncio.run(main())
    finally:
        placement.close()
    assert quick[0] != loop_thread  # nothing known of it yet: its batch thread
    assert quick[-1] == loop_thread, quick  # then, known to be quick: at once, on the loop
    assert loop_thread not in slow  # never quick: not on the loop, however quick the other signature is


def test_the_calls_of_one_loop_turn_run_on_the_loop_as_one_batch(service) -> None:
    placement = CallPlacement(4, "test-call")
    queue = QueuedCalls(service.api, batched=True)

    async def sized() -> dict[str, int]:
        return json.loads(await _predict(queue, placement, "sized"))["predictions"][0]

    async def main() -> tuple[int, list[dict[str, int]]]:
        for _ in range(3):  # its first batch, in a batch thread, shows it quick
            await sized()
        return threading.get_ident(), await asyncio.gather(*(sized() for _ in range(8)))

    try:
        loop_thread, answers = asyncio.run(main())
    finally:
        placement.close()
    assert answers == [{"thread": loop_thread, "rows": 8}] * 8


def test_a_call_refused_before_it_ran_gives_its_version_back(service) -> None:
    # More rows than a batch holds: the batcher does not take it, so it waits for the door's
    # pool, whose one thread is busy and whose queue holds none.
    placement = CallPlacement(1, "test-call", max_queued=0)
    queue = QueuedCalls(service.api, batched=True)
    release = threading.Event()

    async def main() -> None:
        busy = asyncio.ensure_future(placement.run("other", 0, release.wait, may_inline=False, group="two_speeds"))
        await asyncio.sleep(0.05)
        try:
            with pytest.raises(Overloaded):
                await _predict(queue, placement, "serving_default", rows=40)
        finally:
            release.set()
            await busy

    try:
        asyncio.run(main())
    finally:
        placement.close()
    with service.api.manager.acquire("two_speeds", None, None) as version:
        assert version.refs == 1  # this handle's own: the refused call's was given back
