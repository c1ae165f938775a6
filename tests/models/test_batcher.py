"""Unit tests of the dynamic batcher and its options, against a fake thread-safe model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tfservo.core.errors import InvalidArgument, ResourceExhausted, Unavailable
from tfservo.models.batching import Batcher, BatchingOptions, make_runner_factory
from tfservo.models.batching.batcher import LoopBatches


class FakeModel:
    """y = 2x + 1 row by row; records every call's inputs; optionally slow, failing or gated."""

    def __init__(self, delay: float = 0.005) -> None:
        self.delay = delay
        self.calls: list[dict[str, np.ndarray]] = []
        self.output_keys: list[Sequence[str] | None] = []
        self.lock = threading.Lock()
        self.error: Exception | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def run(
        self, signature: str, inputs: dict[str, np.ndarray], output_keys: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        with self.lock:
            self.calls.append(inputs)
            self.output_keys.append(output_keys)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        x = inputs["x"]
        out = {"y": x * 2 + 1, "rowsum": x.reshape(x.shape[:1] + (-1,)).sum(axis=-1)}
        if output_keys is not None:
            out = {k: out[k] for k in output_keys}
        return out

    @property
    def batch_sizes(self) -> list[int]:
        return [len(c["x"]) for c in self.calls]


def opts(**kw: object) -> BatchingOptions:
    base: dict[str, object] = dict(
        max_batch_size=8, batch_timeout_micros=20_000, num_batch_threads=2, max_enqueued_batches=100
    )
    base.update(kw)
    return BatchingOptions(**base)  # type: ignore[arg-type]


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


def make(model: FakeModel, **kw: object) -> Batcher:
    return Batcher(model.run, opts(**kw), name="fake version 1")


def wait_until(check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.001)


def test_concurrent_callers_get_exactly_their_own_rows(model: FakeModel) -> None:
    hook: list[tuple[int, int, float]] = []
    batcher = Batcher(model.run, opts(), name="fake", on_batch=lambda *a: hook.append(a))
    barrier = threading.Barrier(64)

    def call(i: int) -> None:
        rows = 1 + i % 3
        x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 1000 * i
        barrier.wait()
        out = batcher("serving_default", {"x": x})
        np.testing.assert_array_equal(out["y"], x * 2 + 1)
        np.testing.assert_array_equal(out["rowsum"], x.sum(axis=1))

    try:
        with ThreadPoolExecutor(64) as pool:
            list(pool.map(call, range(64)))
    finally:
        batcher.close()
    total = sum(1 + i % 3 for i in range(64))
    assert sum(model.batch_sizes) == total
    assert max(model.batch_sizes) <= 8
    assert len(model.calls) < 64, "no calls were merged"
    assert sum(h[0] for h in hook) == total and all(h[0] == h[1] and h[2] >= 0 for h in hook)


def test_different_shapes_dtypes_and_output_keys_are_never_merged(model: FakeModel) -> None:
    batcher = make(model, batch_timeout_micros=50_000)
    variants = [
        (np.float32, 3, None),
        (np.float32, 4, None),
        (np.float64, 3, None),
        (np.float32, 3, ("y",)),
    ]

    def call(i: int) -> None:
        dtype, width, keys = variants[i % 4]
        x = np.full((1, width), i, dtype=dtype)
        out = batcher("serving_default", {"x": x}, keys)
        assert set(out) == ({"y"} if keys else {"y", "rowsum"})
        np.testing.assert_array_equal(out["y"], x * 2 + 1)

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(call, range(16)))
    finally:
        batcher.close()
    for inputs, _keys in zip(model.calls, model.output_keys):
        x = inputs["x"]
        assert len(set(x[:, 0].astype(int) % 4)) == 1, "different kinds of input were merged"
    assert len(model.calls) < 16


def test_oversize_request_is_split_and_reassembled(model: FakeModel) -> None:
    # max_enqueued_batches=1: the later chunks wait for room instead of being refused.
    batcher = make(model, max_batch_size=4, batch_timeout_micros=0, max_enqueued_batches=1)
    x = np.arange(22, dtype=np.int64).reshape(11, 2)
    try:
        out = batcher("serving_default", {"x": x})
    finally:
        batcher.close()
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    np.testing.assert_array_equal(out["rowsum"], x.sum(axis=1))
    assert model.batch_sizes == [4, 4, 3]


def test_allowed_batch_sizes_pad_with_first_row_and_drop_padding(model: FakeModel) -> None:
    hook: list[tuple[int, int, float]] = []
    batcher = Batcher(
        model.run,
        opts(allowed_batch_sizes=(2, 4, 8), batch_timeout_micros=0),
        on_batch=lambda *a: hook.append(a),
    )
    x = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    try:
        out = batcher("serving_default", {"x": x})
    finally:
        batcher.close()
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    np.testing.assert_array_equal(model.calls[0]["x"], [[1.0], [2.0], [3.0], [1.0]])
    assert [(s, p) for s, p, _, _ in hook] == [(3, 4)]


def test_full_queue_fails_fast_with_resource_exhausted(model: FakeModel) -> None:
    model.gate = threading.Event()
    batcher = make(
        model, max_batch_size=1, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=1
    )
    x = np.ones((1, 2), dtype=np.float32)
    try:
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(batcher, "serving_default", {"x": x})
            assert model.entered.wait(5)  # the only thread is busy with the first batch
            queued = pool.submit(batcher, "serving_default", {"x": x})
            deadline = time.monotonic() + 5
            while not any(q.batches for q in batcher._scheduler._queues.values()):
                assert time.monotonic() < deadline
                time.sleep(0.001)
            t0 = time.monotonic()
            full = "batch queue full for model fake version 1.*retry later"
            with pytest.raises(ResourceExhausted, match=full):
                batcher("serving_default", {"x": x})
            assert time.monotonic() - t0 < 0.5
            model.gate.set()
            np.testing.assert_array_equal(running.result(5)["y"], x * 2 + 1)
            np.testing.assert_array_equal(queued.result(5)["y"], x * 2 + 1)
    finally:
        model.gate.set()
        batcher.close()


def test_model_exception_reaches_every_caller_in_the_batch(model: FakeModel) -> None:
    model.error = ValueError("boom")
    batcher = make(model, batch_timeout_micros=100_000)
    barrier = threading.Barrier(8)

    def call(i: int) -> str:
        barrier.wait()
        with pytest.raises(ValueError, match="boom") as info:
            batcher("serving_default", {"x": np.full((1, 2), i, dtype=np.float32)})
        return str(info.value)

    try:
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(call, range(8))) == ["boom"] * 8
    finally:
        batcher.close()
    assert model.batch_sizes == [8]


def test_output_that_is_not_batch_major_fails_clearly() -> None:
    batcher = Batcher(
        lambda sig, inputs, keys: {"total": np.asarray(inputs["x"].sum())}, opts(batch_timeout_micros=0)
    )
    try:
        with pytest.raises(InvalidArgument, match="output 'total'.*batch size"):
            batcher("serving_default", {"x": np.ones((2, 2))})
    finally:
        batcher.close()


def test_lone_request_waits_for_the_timeout_but_not_forever(model: FakeModel) -> None:
    batcher = make(model, batch_timeout_micros=200_000)
    try:
        t0 = time.monotonic()
        batcher("serving_default", {"x": np.ones((1, 2))})
        elapsed = time.monotonic() - t0
    finally:
        batcher.close()
    assert 0.18 <= elapsed < 1.5


def test_eager_runs_a_lone_request_without_waiting(model: FakeModel) -> None:
    batcher = make(model, batch_timeout_micros=5_000_000, eager=True)
    try:
        t0 = time.monotonic()
        out = batcher("serving_default", {"x": np.ones((1, 2))})
        elapsed = time.monotonic() - t0
    finally:
        batcher.close()
    assert elapsed < 1.0
    np.testing.assert_array_equal(out["y"], np.full((1, 2), 3.0))


def test_eager_still_batches_under_load(model: FakeModel) -> None:
    model.delay = 0.02
    batcher = make(model, eager=True, num_batch_threads=1, batch_timeout_micros=5_000_000)
    try:
        with ThreadPoolExecutor(24) as pool:
            list(pool.map(lambda i: batcher("serving_default", {"x": np.full((1, 1), i)}), range(24)))
    finally:
        batcher.close()
    assert max(model.batch_sizes) > 1


def test_inconsistent_batch_sizes_scalars_and_closing(model: FakeModel) -> None:
    batcher = make(model, batch_timeout_micros=1_000_000)
    with pytest.raises(InvalidArgument, match="different batch sizes.*x: 2, z: 3"):
        batcher("serving_default", {"x": np.ones((2, 1)), "z": np.ones((3, 1))})
    out = batcher("serving_default", {"x": np.float32(4.0)})  # rank 0: run directly
    assert float(out["y"]) == 9.0
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(batcher, "serving_default", {"x": np.ones((1, 1))})
        time.sleep(0.05)  # queued, waiting for the 1 s timeout
        batcher.close()
        with pytest.raises(Unavailable):
            pending.result(5)
    with pytest.raises(Unavailable):
        batcher("serving_default", {"x": np.ones((1, 1))})


def test_runner_factory_wraps_each_version_with_shared_threads(model: FakeModel) -> None:
    seen: list[tuple[str, int, int]] = []
    factory = make_runner_factory(opts(batch_timeout_micros=0), on_batch=lambda m, s, p, t, q: seen.append((m, s, p)))
    sv1 = SimpleNamespace(model_name="m", version=1, model=model, span_attributes=lambda signature: {})
    sv2 = SimpleNamespace(model_name="m", version=2, model=model, span_attributes=lambda signature: {})
    b1, b2 = factory(sv1), factory(sv2)  # type: ignore[arg-type]
    try:
        assert b1.name == "m version 1" and b1._scheduler is b2._scheduler
        out = b2("serving_default", {"x": np.ones((2, 1))})
        np.testing.assert_array_equal(out["y"], np.full((2, 1), 3.0))
        assert seen == [("m", 2, 2)]  # the hook learns which model ran the batch
    finally:
        b1.close()
        b2.close()
        factory.close()


# -- options ---------------------------------------------------------------------------------


def test_options_from_env() -> None:
    assert BatchingOptions.from_env({}) is None
    assert BatchingOptions.from_env({"SAGEMAKER_TFS_ENABLE_BATCHING": "false"}) is None
    o = BatchingOptions.from_env({"SAGEMAKER_TFS_ENABLE_BATCHING": "true"})
    assert o is not None and (o.max_batch_size, o.batch_timeout_micros) == (8, 1000)
    assert o.num_batch_threads >= 1 and o.max_enqueued_batches >= 1
    o = BatchingOptions.from_env(
        {
            "SAGEMAKER_TFS_ENABLE_BATCHING": "TRUE",
            "SAGEMAKER_TFS_MAX_BATCH_SIZE": "32",
            "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "5000",
            "SAGEMAKER_TFS_NUM_BATCH_THREADS": "3",
            "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "7",
        }
    )
    assert o == BatchingOptions(32, 5000, 3, 7)


@pytest.mark.parametrize(
    "env, var",
    [
        ({"SAGEMAKER_TFS_ENABLE_BATCHING": "maybe"}, "SAGEMAKER_TFS_ENABLE_BATCHING"),
        ({"SAGEMAKER_TFS_MAX_BATCH_SIZE": "eight"}, "SAGEMAKER_TFS_MAX_BATCH_SIZE"),
        ({"SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "-1"}, "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS"),
        ({"SAGEMAKER_TFS_NUM_BATCH_THREADS": "0"}, "SAGEMAKER_TFS_NUM_BATCH_THREADS"),
        ({"SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "1.5"}, "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES"),
    ],
)
def test_options_from_env_rejects_bad_values(env: dict[str, str], var: str) -> None:
    env = {"SAGEMAKER_TFS_ENABLE_BATCHING": "true", **env}
    with pytest.raises(ValueError, match=var):
        BatchingOptions.from_env(env)


def test_options_from_parameters_file(tmp_path: Path) -> None:
    path = tmp_path / "batching.config"
    path.write_text(
        "# TF Serving batching parameters\n"
        "max_batch_size { value: 32 }\n"
        "batch_timeout_micros { value: 5000 }\n"
        "num_batch_threads { value: 4 }\n"
        "max_enqueued_batches { value: 100 }\n"
        "allowed_batch_sizes: 8\nallowed_batch_sizes: 16\nallowed_batch_sizes: 32\n"
        "pad_variable_length_inputs: true\n"
    )
    assert BatchingOptions.from_parameters_file(path) == BatchingOptions(32, 5000, 4, 100, (8, 16, 32))
    path.write_text("batch_timeout_micros { value: 0 }\n")  # omitted fields: TF Serving's defaults
    o = BatchingOptions.from_parameters_file(path)
    assert (o.max_batch_size, o.batch_timeout_micros, o.max_enqueued_batches) == (1000, 0, 10)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("max_batch_size { value: 32 ", "not a valid BatchingParameters"),
        ("max_batch_sise { value: 32 }", "max_batch_sise"),
        ("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n", "must equal max_batch_size"),
        ("max_batch_size { value: 8 }\nallowed_batch_sizes: 8\nallowed_batch_sizes: 4\n", "increasing"),
    ],
)
def test_options_from_bad_parameters_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "batching.config"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem) as info:
        BatchingOptions.from_parameters_file(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="cannot read"):
        BatchingOptions.from_parameters_file(tmp_path / "missing.config")


def test_submit_hands_each_caller_its_rows_through_its_callback(model: FakeModel) -> None:
    batcher = make(model, batch_timeout_micros=50_000)
    results: dict[int, tuple[dict[str, np.ndarray] | None, BaseException | None]] = {}
    done = threading.Semaphore(0)

    def callback_for(i: int):
        def callback(outputs, error) -> None:
            results[i] = (outputs, error)
            done.release()

        return callback

    inputs = {i: np.full((1 + i % 2, 2), i, dtype=np.float32) for i in range(6)}
    try:
        for i, x in inputs.items():
            assert batcher.submit("serving_default", {"x": x}, None, callback_for(i)) is True
        for _ in inputs:
            assert done.acquire(timeout=5)
        # Oversize calls and scalars are not taken without blocking: nothing is queued for them.
        assert batcher.submit("serving_default", {"x": np.ones((9, 2), np.float32)}, None, callback_for(99)) is False
        assert batcher.submit("serving_default", {"x": np.float32(1)}, None, callback_for(98)) is False
    finally:
        batcher.close()
    for i, x in inputs.items():
        outputs, error = results[i]
        assert error is None
        np.testing.assert_array_equal(outputs["y"], x * 2 + 1)
    assert sum(model.batch_sizes) == sum(len(x) for x in inputs.values())
    assert len(model.calls) < len(inputs), "submitted calls were not merged"


def test_submit_reports_model_errors_and_refuses_when_full(model: FakeModel) -> None:
    model.error = ValueError("boom")
    model.gate = threading.Event()
    batcher = make(model, max_batch_size=1, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=1)
    errors: list[BaseException | None] = []
    x = np.ones((1, 2), dtype=np.float32)
    try:
        assert batcher.submit("serving_default", {"x": x}, None, lambda o, e: errors.append(e))
        assert model.entered.wait(5)
        assert batcher.submit("serving_default", {"x": x}, None, lambda o, e: errors.append(e))
        with pytest.raises(ResourceExhausted, match="batch queue full"):
            batcher.submit("serving_default", {"x": x}, None, lambda o, e: errors.append(e))
        model.gate.set()
        wait_until(lambda: len(errors) == 2)
    finally:
        model.gate.set()
        batcher.close()
    assert [str(e) for e in errors] == ["boom", "boom"]


# -- adaptive mode (tfservo's default) ---------------------------------------------------------


def submit_all(batcher: Batcher, xs: Sequence[np.ndarray]) -> list[threading.Event]:
    """Queue each x without waiting; its event is set once its callback has its result."""
    events: list[threading.Event] = []
    for x in xs:
        event = threading.Event()
        events.append(event)

        def callback(outputs, error, event=event) -> None:
            event.outputs, event.error = outputs, error  # type: ignore[attr-defined]
            event.set()

        assert batcher.submit("serving_default", {"x": x}, None, callback) is True
    return events


def first_running_then_rest(
    batcher: Batcher, xs: Sequence[np.ndarray], entered: threading.Event, gate: threading.Event
) -> list[threading.Event]:
    """Queue xs[0] and wait until its batch runs (held at `gate`), queue the rest meanwhile,
    release the gate; every call's event, once all are answered."""
    try:
        events = submit_all(batcher, xs[:1])
        assert entered.wait(10)
        events += submit_all(batcher, xs[1:])
    finally:
        gate.set()
    for event in events:
        assert event.wait(10)
    return events


def test_adaptive_runs_a_lone_request_at_once(model: FakeModel) -> None:
    batcher = make(model, adaptive=True, batch_timeout_micros=600_000_000)  # a timeout no test waits for
    try:
        for i in range(3):  # each finds the batcher idle
            (event,) = submit_all(batcher, [np.full((1, 2), i, dtype=np.float32)])
            assert event.wait(10), "a lone request waited for its batch to fill"
    finally:
        batcher.close()
    assert model.batch_sizes == [1, 1, 1]


def test_adaptive_batches_what_arrives_while_a_batch_runs(model: FakeModel) -> None:
    model.gate = threading.Event()
    batcher = make(model, adaptive=True, batch_timeout_micros=300_000)
    xs = [np.full((1, 2), i, dtype=np.float32) for i in range(7)]
    try:  # the rest are queued while the first batch runs: they wait to merge
        events = first_running_then_rest(batcher, xs, model.entered, model.gate)
    finally:
        batcher.close()
    assert model.batch_sizes == [1, 6]
    for x, event in zip(xs, events):
        np.testing.assert_array_equal(event.outputs["y"], x * 2 + 1)  # type: ignore[attr-defined]


def test_adaptive_runs_a_call_that_fills_a_batch_alone_without_splitting_it(model: FakeModel) -> None:
    batcher = make(model, adaptive=True, batch_timeout_micros=600_000_000)
    try:
        out = batcher("serving_default", {"x": np.ones((20, 2), np.float32)})
        assert batcher.submit("serving_default", {"x": np.ones((8, 2), np.float32)}, None, lambda o, e: None) is False
    finally:
        batcher.close()
    assert model.batch_sizes == [20] and out["y"].shape == (20, 2)


def test_adaptive_gives_each_caller_its_own_answer_when_outputs_are_not_batch_major() -> None:
    gate, entered, calls = threading.Event(), threading.Event(), []

    def total(sig: str, inputs: dict[str, np.ndarray], keys: object) -> dict[str, np.ndarray]:
        calls.append(len(inputs["x"]))
        entered.set()
        gate.wait(10)
        return {"total": np.asarray(inputs["x"].sum())}  # one number for the whole call

    batcher = Batcher(total, opts(adaptive=True, batch_timeout_micros=300_000))
    xs = [np.full((1, 1), i, dtype=np.float32) for i in (1, 2, 3, 4)]
    try:
        events = first_running_then_rest(batcher, xs, entered, gate)
        later = batcher("serving_default", {"x": np.full((2, 1), 5, np.float32)})
    finally:
        batcher.close()
    assert [float(e.outputs["total"]) for e in events] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    # The merged batch of three ran, could not be split, and ran again call by call; later calls run alone.
    assert calls == [1, 3, 1, 1, 1, 2] and float(later["total"]) == 10


def test_adaptive_reruns_a_failed_merged_batch_call_by_call(model: FakeModel) -> None:
    model.gate = threading.Event()
    runs = model.run

    def refuses_negatives(sig: str, inputs: dict[str, np.ndarray], keys: object = None) -> dict[str, np.ndarray]:
        out = runs(sig, inputs, keys)  # type: ignore[arg-type]
        if (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return out

    batcher = Batcher(refuses_negatives, opts(adaptive=True, batch_timeout_micros=300_000))
    xs = [np.full((1, 2), v, dtype=np.float32) for v in (0, 1, -1, 2)]
    try:
        events = first_running_then_rest(batcher, xs, model.entered, model.gate)
    finally:
        batcher.close()
    assert [type(e.error).__name__ if e.error else None for e in events] == [None, None, "ValueError", None]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(events[3].outputs["y"], xs[3] * 2 + 1)  # type: ignore[attr-defined]
    assert model.batch_sizes == [1, 3, 1, 1, 1]


def test_adaptive_batches_a_quick_models_calls_on_their_event_loop_and_a_slow_ones_in_threads(model: FakeModel) -> None:
    batcher = make(model, adaptive=True, batch_timeout_micros=300_000)
    answers: list[tuple[str, np.ndarray]] = []

    def callback(outputs, error) -> None:
        assert error is None
        answers.append((threading.current_thread().name, outputs["y"]))

    xs = [np.full((1, 2), v, np.float32) for v in range(5)]

    async def turn(count: int) -> None:
        """`count` calls submitted in one turn of the loop, then the turns until they answer."""
        here = LoopBatches(asyncio.get_running_loop().call_soon)
        before = len(answers)
        for x in xs[:count]:
            assert batcher.submit("serving_default", {"x": x}, None, callback, here=here)
        while len(answers) < before + count:
            await asyncio.sleep(0.001)

    loop_thread = threading.current_thread().name

    def back_on_the_loop() -> None:
        """One-call turns on batch threads until one of their batches measured quick (on a loaded
        machine a thread batch's time includes the wait to take the GIL back from the loop)."""
        for _ in range(20):
            asyncio.run(turn(1))
            if answers[-1][0] == loop_thread:
                return

    model.delay = 0
    try:
        asyncio.run(turn(1))  # nothing known of its speed yet: a batch thread
        back_on_the_loop()
        quick = len(answers)
        asyncio.run(turn(5))  # quick: the five, one batch, on the loop
        model.delay = 0.005
        for _ in range(8):  # one slow batch may be the OS's doing: on the loop until its last 8 were slow
            asyncio.run(turn(1))
        slow = len(answers)
        asyncio.run(turn(2))  # now known to be slow: a batch thread
        model.delay = 0
        asyncio.run(turn(1))  # a batch thread, where it runs quick again
        back_on_the_loop()
    finally:
        batcher.close()
    threads = [name for name, _ in answers]
    assert loop_thread not in threads[: quick - 1] and threads[quick - 1] == loop_thread, threads
    assert threads[quick:quick + 5] == [loop_thread] * 5, threads  # the five, one batch, on the loop
    # The slow turns stay on the loop until 8 batches measured slow; on a loaded machine the
    # quick batch of five may itself measure slow, which brings the switch one turn early.
    assert threads[quick + 5:slow - 1] == [loop_thread] * 7, threads
    assert loop_thread not in threads[slow:-1] and threads[-1] == loop_thread, threads
    sizes, singles = model.batch_sizes, len(threads) - slow - 2  # the one-call turns after the turn of two
    assert sizes[: quick + 9] == [1] * quick + [5] + [1] * 8 and sum(sizes[quick + 9 : -singles]) == 2, sizes
    assert sizes[-singles:] == [1] * singles, sizes
    for (_, y), x in zip(answers[quick : quick + 5], xs, strict=True):
        np.testing.assert_array_equal(y, x * 2 + 1)  # each caller its own rows


def test_adaptive_blocking_calls_run_in_their_own_thread_when_idle_and_merge_under_load(model: FakeModel) -> None:
    ran_in: list[str] = []
    runs = model.run

    def recording(sig, inputs, keys=None):
        ran_in.append(threading.current_thread().name)
        return runs(sig, inputs, keys)

    batcher = Batcher(recording, opts(adaptive=True, batch_timeout_micros=300_000))
    try:
        batcher("serving_default", {"x": np.ones((1, 2), np.float32)})
        assert ran_in == [threading.current_thread().name]  # idle: no hand-off to a batch thread
        model.delay = 0.2
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: batcher("serving_default", {"x": np.full((1, 2), i, np.float32)}), range(8)))
    finally:
        batcher.close()
    assert max(model.batch_sizes) > 1  # the calls that came while one ran were merged


def test_adaptive_runs_a_lone_call_at_once_unless_others_are_batching(model: FakeModel) -> None:
    """A call its door holds alone runs at once on an idle batcher (`run_lone` returns its
    outputs); one that finds calls gathering on the loop joins them, and one that finds a batch
    running waits for the loop's turn instead of blocking the loop (`run_lone` declines, and
    the door submits it)."""
    batcher = make(model, adaptive=True, batch_timeout_micros=300_000)
    model.delay = 0
    answers: list[np.ndarray] = []

    def callback(outputs, error) -> None:
        assert error is None
        answers.append(outputs["y"])

    async def submit(*lone: bool) -> list[bool]:
        """One call per flag in one turn of the loop: whether each was answered within submit."""
        here = LoopBatches(asyncio.get_running_loop().call_soon)
        at_once, expected = [], len(answers) + len(lone)
        for i, flag in enumerate(lone):
            inputs = {"x": np.full((1, 2), i, np.float32)}
            outputs = batcher.run_lone("serving_default", inputs, None, here) if flag else None
            if outputs is not None:
                callback(outputs, None)
            else:
                assert batcher.submit("serving_default", inputs, None, callback, here=here)
            at_once.append(outputs is not None)
        while len(answers) < expected:
            await asyncio.sleep(0.001)
        return at_once

    try:
        batcher("serving_default", {"x": np.zeros((1, 2), np.float32)})  # measured quick
        assert asyncio.run(submit(True)) == [True]
        np.testing.assert_array_equal(answers[-1], np.full((1, 2), 1, np.float32))
        assert asyncio.run(submit(False)) == [False]  # not known to be alone: the loop's turn
        assert asyncio.run(submit(False, True)) == [False, False]  # joins the call gathering
        assert model.batch_sizes[-1] == 2
        model.gate, model.delay = threading.Event(), 0.0
        model.entered.clear()
        running = threading.Thread(target=batcher, args=("serving_default", {"x": np.ones((1, 2), np.float32)}))
        running.start()
        assert model.entered.wait(5)

        async def while_running() -> list[bool]:
            task = asyncio.ensure_future(submit(True))
            await asyncio.sleep(0.05)
            assert model.gate is not None
            model.gate.set()  # the loop was free meanwhile: this coroutine ran
            return await task

        assert asyncio.run(while_running()) == [False]
        running.join(5)
    finally:
        batcher.close()
    np.testing.assert_array_equal(answers[-1], np.full((1, 2), 1, np.float32))


def test_run_lone_declines_what_must_not_run_on_the_loop(model: FakeModel) -> None:
    """`run_lone` runs nothing (None) for a kind of call never measured, one measured slow, a
    call of more rows than a batch holds, or a batcher that is not adaptive: those are submitted."""
    x = {"x": np.zeros((1, 2), np.float32)}

    async def lone(batcher: Batcher, inputs: dict[str, np.ndarray]) -> object:
        return batcher.run_lone("serving_default", inputs, None, LoopBatches(asyncio.get_running_loop().call_soon))

    adaptive = make(model, adaptive=True, max_batch_size=4)
    timeout = make(model)
    try:
        model.delay = 0.0
        assert asyncio.run(lone(adaptive, x)) is None  # never ran: not known to be quick
        for _ in range(4):  # the quickest of a few runs is the kind's cost: one run slowed by a loaded machine is not
            adaptive("serving_default", x)
        assert asyncio.run(lone(adaptive, x)) is not None
        assert asyncio.run(lone(adaptive, {"x": np.zeros((5, 2), np.float32)})) is None
        timeout("serving_default", x)
        assert asyncio.run(lone(timeout, x)) is None
        model.delay = 0.01  # 10 ms a call: slow for a loop
        for _ in range(8):
            adaptive("serving_default", x)
        calls = len(model.calls)
        assert asyncio.run(lone(adaptive, x)) is None
        assert len(model.calls) == calls
    finally:
        adaptive.close()
        timeout.close()
