"""`tfservo tune` on the example bundle, as a user runs it: it finishes within its budget, its
table, tune.json and plot say what it measured, the config it writes starts `serve --config`,
and its scaling rules validate. Its load generator is checked against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import tomllib
from manifest_schemas import schema_errors
from server_process import ServerProcess

from tfservo.tune.load import HttpTarget, closed_loop, open_loop

REPO = Path(__file__).resolve().parents[2]
TUNE = [sys.executable, "-m", "tfservo", "tune"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("example")
    subprocess.run([sys.executable, str(REPO / "examples" / "build_models.py"), str(root)], check=True,
                   capture_output=True)
    return root / "half_plus_ten"


@pytest.fixture(scope="module")
def tuned(bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "out"
    started = time.monotonic()
    proc = subprocess.run(
        [*TUNE, str(bundle), "--p99", "50ms", "--budget", "120s", "--step", "0.5s", "--out", str(out),
         "--rate", "2500", "--emit", "k8s", "--emit", "sagemaker"],
        capture_output=True, text=True, timeout=240,
    )
    return proc, out, time.monotonic() - started


def test_tune_finishes_within_its_budget_and_says_what_it_measured(tuned):
    proc, out, elapsed = tuned
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert elapsed < 120 + 25, elapsed  # the budget, and the interpreter's start and the last server's stop
    doc = json.loads((out / "tune.json").read_text())
    trials = doc["trials"]
    assert len(trials) >= 2, trials
    assert set(trials[0]["ladders"]) == {"tfs-json", "v2-binary", "grpc"}  # protocols compared on the first server
    table = proc.stdout
    assert "req/s at p99≤50ms" in table
    rows = [line for line in table.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == sum(len(t["ladders"]) for t in trials)
    for trial in trials:
        for protocol, runs in trial["ladders"].items():
            assert runs and all(r["requests"] > 0 for r in runs), (protocol, runs)
            assert [r["level"] for r in runs] == [1, 2, 4, 8, 16, 32, 64, 128][: len(runs)]
    chosen = doc["chosen"]
    # a change is kept only when it gains more than the noise: nothing tried beats the pick by more
    assert chosen["rps_at_target"] in [t["rps_at_target"] for t in trials]
    assert max(t["rps_at_target"] for t in trials) <= chosen["rps_at_target"] * (1 + doc["noise"]) + 1e-6
    assert chosen["concurrency_at_target"] >= 1 and chosen["open_loop"]
    assert f"per instance at p99 ≤ 50 ms: {chosen['concurrency_at_target']} requests in flight" in table
    assert f"for 2500 req/s: {chosen['instances_for_rate']} instances" in table
    assert "InvocationsPerInstance" in table and "put_scaling_policy" in table
    assert 0.02 <= doc["noise"] < 1 and doc["stopped"]
    # progress went to stderr as it ran, one line per load level
    assert proc.stderr.count(" clients ") >= sum(len(runs) for t in trials for runs in t["ladders"].values())
    png = (out / "tune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_the_config_it_writes_is_what_serve_starts_with(tuned):
    proc, out, _ = tuned
    config = tomllib.loads((out / "tuned.toml").read_text())
    chosen = json.loads((out / "tune.json").read_text())["chosen"]["settings"]
    assert {k: v for k, v in config.items() if k != "paths"} == chosen
    with ServerProcess(["--config", str(out / "tuned.toml")]) as server, server.client() as http:
        r = http.post("/v1/models/half_plus_ten:predict", content=b'{"instances": [1.0, 2.0]}')
        assert r.json() == {"predictions": [10.5, 11.0]}


def test_the_scaling_rules_it_emits_validate_and_carry_its_measurement(tuned):
    proc, out, _ = tuned
    chosen = json.loads((out / "tune.json").read_text())["chosen"]
    errors = schema_errors(out / "k8s" / "keda-scaledobject.yaml", out / "k8s" / "hpa.yaml")
    assert set(errors.values()) == {None}, errors
    assert f'threshold: "{chosen["concurrency_at_target"]}"' in (out / "k8s" / "keda-scaledobject.yaml").read_text()
    assert f'averageValue: "{chosen["concurrency_at_target"]}"' in (out / "k8s" / "hpa.yaml").read_text()


def test_bad_arguments_are_refused_before_any_server_starts(bundle, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    cases = [
        (["--p99", "fast"], "'fast' is not a duration"),
        (["--budget", "10s"], "leaves no room for a search"),
        (["--requests", str(empty)], "is empty"),
    ]
    for args, message in cases:
        started = time.monotonic()
        proc = subprocess.run([*TUNE, str(bundle), "--out", str(tmp_path / "o"), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "o" / "servers.log").exists()
        assert time.monotonic() - started < 30


def test_the_load_generator_counts_answers_errors_and_open_loop_arrivals(bundle):
    with ServerProcess([str(bundle), "--no-supervisor"]) as server:
        port = httpx.URL(server.url).port
        good = HttpTarget("127.0.0.1", port, "/v1/models/half_plus_ten:predict", b'{"instances": [1.0]}')
        run = closed_loop(good, 4, 1.0)
        assert run.errors == 0 and len(run.latencies) > 50 and run.p50_ms <= run.p99_ms
        bad = HttpTarget("127.0.0.1", port, "/v1/models/nothing:predict", b'{"instances": [1.0]}')
        refused = closed_loop(bad, 2, 0.5)
        assert refused.errors > 10 and len(refused.latencies) == 0
        paced = open_loop(good, 100.0, 2.0, clients=8)
        # Poisson arrivals at 100/s for 2 s: 200 expected; ±5 standard deviations
        assert 130 <= len(paced.latencies) <= 270 and paced.errors == 0, len(paced.latencies)
