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
    """mlp (64 → 128 relu → 10) and cnn (28×28×1, two 3×3 convs, dense 10) as .keras files; bodies."""
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
        bodies[name] = json.dumps({"instances": [np.round(row, 4).tolist()]})
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
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for _ in range(rounds):
        for kind in ("keras", "saved"):
            s = server(kind, root)
            s.start(root / "logs")
            try:
                assert s.proc is not None
                for model in ("mlp", "cnn"):
                    url = s.base_url + s.endpoints[model].path
                    run_wrk(url, bodies[model], connections=4, seconds=1, server_pid=s.proc.pid)  # warm up
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

            def med(runs: list[dict], key: str) -> float:
                return statistics.median(r[key] for r in runs)

            def cpu_ms(runs: list[dict]) -> float:
                return statistics.median(1e3 * r["server_cores"] / r["rps"] for r in runs)

            rows.append({
                "model": model, "clients": clients,
                ".keras req/s": round(med(k, "rps")), "SavedModel req/s": round(med(v, "rps")),
                "ratio req/s": f"{med(k, 'rps') / med(v, 'rps'):.2f}×",
                ".keras p50 ms": round(med(k, "p50_ms"), 3), "SavedModel p50 ms": round(med(v, "p50_ms"), 3),
                ".keras CPU ms/req": round(cpu_ms(k), 3), "SavedModel CPU ms/req": round(cpu_ms(v), 3),
                "ratio CPU/req": f"{cpu_ms(k) / cpu_ms(v):.2f}×",
                "range req/s (.keras, SavedModel)": f"{min(r['rps'] for r in k):.0f}–{max(r['rps'] for r in k):.0f}, "
                                                    f"{min(r['rps'] for r in v):.0f}–{max(r['rps'] for r in v):.0f}",
            })
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
    rows = serving(root, bodies, seconds=3 if args.quick else 8, rounds=2 if args.quick else 3)
    checks = load_checks(work, 3 if args.quick else 5)
    save_section(args.results, "keras", {
        "title": "Keras 3 files served as saved, and the checks at load (`bench/keras_bench.py`)",
        "rows": rows,
        "notes": [
            "Same Keras 3 models, `tfservo serve` (1 worker, default batching) on the `.keras` files and on the "
            "SavedModels `tfservo export` wrote of them; wrk on its own core, 1 and 32 closed-loop clients, one row "
            "per request; medians of alternated rounds, ranges beside them. Target: .keras ≥ 0.95× the SavedModel.",
            "A `.keras` version is exported once at load by Keras's model.export into a scratch SavedModel, which "
            "then loads as any SavedModel: the same graph, the session fast path and batching, so the two should "
            "differ by noise only.",
            "Checks at load, ResNet-50 (random weights), same process after TensorFlow's import: "
            + "; ".join(f"{r[next(iter(r))]} {r['median s']} s ({r['of the load']} of the load)" for r in checks)
            + ". Target: the scan ≤ 5 % of the load.",
        ],
        "checks": checks,
    })


if __name__ == "__main__":
    main()
