"""The decode budget is the server's: workers count large bodies in one shared table, and a
worker that died holding bytes is forgotten."""

from __future__ import annotations

import multiprocessing
import os

from tfservo.service.decode_budget import SHARED_FROM, DecodeBudget, create_budget_table

MB = 2**20


def _hold_then(path: str, nbytes: int, ready, done, exit_hard: bool) -> None:
    budget = DecodeBudget(10 * MB, path)
    assert budget.hold(nbytes)
    ready.set()
    done.wait(30)
    if exit_hard:
        os._exit(0)  # killed while holding: no release
    budget.release(nbytes)
    budget.close()


def _other_worker(path: str, nbytes: int, exit_hard: bool):
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    process = ctx.Process(target=_hold_then, args=(path, nbytes, ready, done, exit_hard))
    process.start()
    assert ready.wait(30)
    return process, done


def test_another_workers_large_body_counts_against_this_one(tmp_path) -> None:
    path = str(tmp_path / "budget")
    create_budget_table(path)
    budget = DecodeBudget(10 * MB, path)
    other, done = _other_worker(path, 8 * MB, exit_hard=False)
    try:
        assert budget.server_held == 8 * MB
        assert not budget.hold(8 * MB)  # 16 MB would pass the server's 10
        assert budget.hold(1 * MB)  # what fits beside it still goes
        budget.release(1 * MB)
        assert budget.hold(SHARED_FROM - 1)  # small bodies count in their worker alone
        budget.release(SHARED_FROM - 1)
    finally:
        done.set()
        other.join(30)
    assert budget.server_held == 0
    assert budget.hold(8 * MB)
    budget.release(8 * MB)
    budget.close()


def test_a_worker_that_died_holding_bytes_is_forgotten(tmp_path) -> None:
    path = str(tmp_path / "budget")
    create_budget_table(path)
    other, done = _other_worker(path, 8 * MB, exit_hard=True)
    done.set()
    other.join(30)
    budget = DecodeBudget(10 * MB, path)
    assert budget.server_held == 8 * MB  # still counted until the sum refuses a body
    assert budget.hold(8 * MB)  # refused by the stale sum, recounted from the living: held
    assert budget.server_held == 8 * MB
    budget.release(8 * MB)
    assert budget.server_held == 0
    budget.close()


def test_one_process_without_a_table_keeps_its_own_count() -> None:
    budget = DecodeBudget(10 * MB)
    assert budget.hold(8 * MB) and not budget.hold(8 * MB)
    budget.release(8 * MB)
    assert budget.hold(20 * MB)  # alone, one body always goes
    budget.release(20 * MB)
    assert budget.held == 0
