"""Keras 3 files served as saved (issue 63): the same Keras 3 models — an MLP and a small CNN —
served by `tfservo serve` from their `.keras` files and from the SavedModels `tfservo export`
wrote of them, side by side in one run, at 1 and 32 closed-loop clients (wrk on its own core,
one server worker, rounds alternated so drift hits both): requests/s, p50 and the server's CPU
per request, as ratios .keras / SavedModel (target ≥ 0.95×). Then what checking a model costs
at load, on ResNet-50: `tfservo.models.scan.scan_version` (every load runs it) and a signed
bundle's `verify_dir` (with --require-signature) against the model's own load time, in the
same process after TensorFlow is imported (target: the scan ≤ 5 % of the load).

Writes RESULTS/keras.json in the report's section format.

Usage: python bench/keras_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from load import run_wrk
from models import build_all
from report import save_section, section_arguments
from servers import TFSERVO, Endpoint, Server, free_port

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CLIENTS = (1, 32)


def build_keras(root: Path) -> dict[str, str]:
    """mlp (64 → 128 relu → 10) and cnn (28×28×1, two 3×3 convs, dense 10) as .keras files; their body files."""
    import keras

    keras.utils.set_random_seed(3)
    mlp = keras.Sequential([keras.Input((64,), name="x"), keras.layers.Dense(128, activation="relu"),
                            keras.layers.Dense(10)])
    cnn = keras.Sequential([keras.Input((28, 28, 1), name="image"),
                            keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
                            keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
                            keras.layers.Flatten(), keras.layers.Dense(10)])
    rng = np.random.default_rng(0)
    bodies = {}
    for name, model, row in (("mlp", mlp, rng.standard_normal(64)), ("cnn", cnn, rng.standard_normal((28, 28, 1)))):
        version = root / "keras" / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        model.save(version / "model.keras")
        body = root / "bodies" / f"{name}.json"  # wrk's post.lua reads the body from a file
        body.parent.mkdir(parents=True, exist_ok=True)
        body.write_text(json.dumps({"instances": [np.round(row, 4).tolist()]}))
        bodies[name] = str(body)
    return bodies


def export_all(root: Path) -> None:
    from tfservo.models.keras_export import export_checked

    for name in ("mlp", "cnn"):
        target = root / "saved" / name / "1"
        shutil.rmtree(target.parent, ignore_errors=True)
        export_checked(str(root / "keras" / name / "1"), str(target))


def server(kind: str, root: Path) -> Server:
    port = free_port()
    return Server(
        name=f"tfservo serve, {kind}", family="tfservo",
        command=[str(TFSERVO), "serve", str(root / kind / "mlp"), str(root / kind / "cnn"), "--host", "127.0.0.1",
                 "--port", str(port), "--grpc-port", "0", "--workers", "1", "--log-level", "warning"],
        ready_path="/ping", endpoints={m: Endpoint(f"/v1/models/{m}:predict", m, "tfs") for m in ("mlp", "cnn")},
        port=port, env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "mlp"},
    )


def serving(root: Path, bodies: dict[str, str], seconds: float, rounds: int) -> list[dict]:
    """Rounds of both servers, the order swapped each round (ABBA) so the machine's drift does not
    favour one; each ratio is the median of the rounds' paired ratios, their range beside it."""
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for round_ in range(rounds):
        for kind in ("keras", "saved") if round_ % 2 == 0 else ("saved", "keras"):
            s = server(kind, root)
            s.start(root / "logs")
            try:
                assert s.proc is not None
                for model in ("mlp", "cnn"):
                    url = s.base_url + s.endpoints[model].path
                    run_wrk(url, bodies[model], connections=4, seconds=2, server_pid=s.proc.pid)  # warm up
                    for clients in CLIENTS:
                        got = run_wrk(url, bodies[model], connections=clients, seconds=seconds, server_pid=s.proc.pid)
                        assert got["errors"] == 0, got
                        runs.setdefault((model, kind, clients), []).append(got)
            finally:
                s.stop()
    rows = []
    for model in ("mlp", "cnn"):
        for clients in CLIENTS:
            k, v = runs[(model, "keras", clients)], runs[(model, "saved", clients)]
            rps = [a["rps"] / b["rps"] for a, b in zip(k, v)]
            cpu = [(a["server_cores"] / a["rps"]) / (b["server_cores"] / b["rps"]) for a, b in zip(k, v)]

            def med(runs: list[dict], key: str) -> float:
                return statistics.median(r[key] for r in runs)

            rows.append({
                "model": model, "clients": clients,
                ".keras req/s": round(med(k, "rps")), "SavedModel req/s": round(med(v, "rps")),
                "ratio req/s (range)": f"{statistics.median(rps):.2f}× ({min(rps):.2f}–{max(rps):.2f})",
                ".keras p50 ms": round(med(k, "p50_ms"), 3), "SavedModel p50 ms": round(med(v, "p50_ms"), 3),
                ".keras CPU ms/req": round(statistics.median(1e3 * r["server_cores"] / r["rps"] for r in k), 3),
                "SavedModel CPU ms/req": round(statistics.median(1e3 * r["server_cores"] / r["rps"] for r in v), 3),
                "ratio CPU/req (range)": f"{statistics.median(cpu):.2f}× ({min(cpu):.2f}–{max(cpu):.2f})",
                "rounds": len(rps),
            })
    return rows


def in_process(root: Path, blocks: int) -> list[dict]:
    """Both loads of each model in one process, their calls interleaved in blocks of 200 (the
    machine's drift falls on both alike): median µs per call of LoadedModel.run, what every door calls."""
    from tfservo.models.keras_model import load_keras_model
    from tfservo.models.savedmodel import load_saved_model

    rows = []
    for name, shape in (("mlp", (64,)), ("cnn", (28, 28, 1))):
        version = root / "keras" / name / "1"
        both = {"keras": load_keras_model(str(version), str(version / "model.keras")),
                "saved": load_saved_model(str(root / "saved" / name / "1"))}
        key = next(iter(both["saved"].signatures["serving_default"].inputs))
        for batch in (1, 32):
            inputs = {key: np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)}
            seconds: dict[str, list[float]] = {"keras": [], "saved": []}
            for block in range(blocks + 1):
                for kind in ("keras", "saved") if block % 2 else ("saved", "keras"):
                    model = both[kind]
                    started = time.perf_counter()
                    for _ in range(200):
                        model.run("serving_default", inputs)
                    if block:  # the first block of each warms up
                        seconds[kind].append((time.perf_counter() - started) / 200)
            k, v = statistics.median(seconds["keras"]), statistics.median(seconds["saved"])
            rows.append({"model": name, "rows": batch, ".keras µs/call": round(k * 1e6, 1),
                         "SavedModel µs/call": round(v * 1e6, 1), ".keras speed": f"{v / k:.2f}×"})
    return rows


def load_checks(work: Path, repeats: int) -> list[dict]:
    """ResNet-50's load, its scan and its signature check, each the median of `repeats` in this process."""
    from tfservo.models.savedmodel import load_saved_model
    from tfservo.models.scan import scan_version
    from tfservo.models.signing import TrustedKeys, new_key, sign_path, verify_dir

    version = build_all(work)["resnet50_version"]
    signed = work / "keras-bench-signed"
    shutil.rmtree(signed, ignore_errors=True)
    shutil.copytree(version, signed / "1")
    key = work / "keras-bench-key.pem"
    for f in (key, Path(str(key) + ".pub")):
        f.unlink(missing_ok=True)
    new_key(str(key))
    sign_path(str(signed), str(key))
    keys = TrustedKeys(str(key) + ".pub")
    load_saved_model(version)  # TensorFlow imported and its kernels registered: not part of any figure

    def timed(fn: object) -> float:
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()  # type: ignore[operator]
            seconds.append(time.perf_counter() - started)
        return statistics.median(seconds)

    loaded = timed(lambda: load_saved_model(version))
    scanned = timed(lambda: scan_version(version))
    verified = timed(lambda: verify_dir(str(signed / "1"), keys, "resnet50"))
    size = sum(f.stat().st_size for f in Path(version).rglob("*") if f.is_file())
    return [
        {"step (ResNet-50, %.0f MB)" % (size / 1e6): "load_saved_model", "median s": round(loaded, 3), "of the load": "1.00×"},
        {"step (ResNet-50, %.0f MB)" % (size / 1e6): "scan_version (every load)", "median s": round(scanned, 4),
         "of the load": f"{scanned / loaded:.3f}×"},
        {"step (ResNet-50, %.0f MB)" % (size / 1e6): "verify_dir (--require-signature)", "median s": round(verified, 3),
         "of the load": f"{verified / loaded:.3f}×"},
    ]


def main() -> None:
    args = section_arguments()
    work = Path(args.workdir)
    root = work / "keras-bench"
    shutil.rmtree(root, ignore_errors=True)
    bodies = build_keras(root)
    export_all(root)
    rows = serving(root, bodies, seconds=3 if args.quick else 5, rounds=2 if args.quick else 6)
    calls = in_process(root, 10 if args.quick else 40)
    checks = load_checks(work, 3 if args.quick else 5)
    save_section(args.results, "keras", {
        "title": "Keras 3 files served as saved, and the checks at load (`bench/keras_bench.py`)",
        "rows": rows,
        "notes": [
            "Same Keras 3 models, `tfservo serve` (1 worker, default batching) on the `.keras` files and on the "
            "SavedModels `tfservo export` wrote of them; wrk on its own core, 1 and 32 closed-loop clients, one row "
            "per request; rounds in ABBA order, each ratio the median of the rounds' paired ratios (their range "
            "beside it). Target: .keras ≥ 0.95× the SavedModel.",
            "A `.keras` version is exported once at load by Keras's model.export into a scratch SavedModel, which "
            "then loads as any SavedModel: the same graph, the session fast path and batching, so the two should "
            "differ by noise only.",
            "Checks at load, ResNet-50 (random weights), same process after TensorFlow's import: "
            + "; ".join(f"{r[next(iter(r))]} {r['median s']} s ({r['of the load']} of the load)" for r in checks)
            + ". Target: the scan ≤ 5 % of the load.",
            "In one process, both loads' calls interleaved (LoadedModel.run, median µs per call, .keras speed "
            "as a share of the SavedModel's): "
            + "; ".join(f"{r['model']} ×{r['rows']}: {r['.keras µs/call']} against {r['SavedModel µs/call']} µs "
                        f"({r['.keras speed']})" for r in calls) + ".",
        ],
        "checks": checks,
        "in_process": calls,
    })


if __name__ == "__main__":
    main()
