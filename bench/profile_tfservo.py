"""Where a tfservo worker's time goes under load: py-spy samples of the thread holding the GIL,
sorted into the stages of a request.

Starts `tfservo serve` on the benchmark's MLP, drives it with wrk (MLP workload, concurrency 32)
and samples it with py-spy (`--gil`: only the thread that holds the GIL, which is what limits
one Python process). Writes RESULTS/profile.json in the report's section format.

Usage: python bench/profile_tfservo.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import servers
from load import run_wrk

PY_SPY = servers.BENCH / ".venv-tools" / "bin" / "py-spy"
# (category, pattern on "function (file:line)" frames); a sample goes to the first category that
# matches, scanning from the innermost frame outwards.
CATEGORIES = [
    ("TensorFlow session call", r"tensorflow/python/client/session\.py|savedmodel\.py:"),
    ("JSON encode (json_codec)", r"^(encode_\w+|_encode_\w+|_dump|_write_tensor|_Writer\.\w+|_Output\.\w+) \(.*json_codec\.py"),
    ("JSON decode (json_codec)", r"json_codec\.py"),
    ("batcher (enqueue, merge, split, hand back)", r"batcher\.py:"),
    ("thread hand-off (anyio to_thread, queues, locks, events)", r"anyio/|queue\.py|threading\.py|concurrent/futures"),
    ("TF Serving API and model manager", r"(api|servables|request_labels|invocation|content_types)\.py:"),
    ("routing, middleware, metrics (app, hot_routes, Starlette)", r"starlette/|(app|hot_routes|call_placement|metrics|shutdown)\.py:|prometheus_client/"),
    ("HTTP protocol (uvicorn + httptools, socket writes)", r"uvicorn/"),
    ("event loop (asyncio/uvloop)", r"asyncio/|uvloop"),
]


def categorize(raw: str) -> Counter:
    counts: Counter = Counter()
    compiled = [(name, re.compile(p)) for name, p in CATEGORIES]
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")[1:]  # the first entry names the thread
        for frame in reversed(frames):
            hit = next((name for name, rx in compiled if rx.search(frame)), None)
            if hit:
                counts[hit] += int(n)
                break
        else:
            counts["other"] += int(n)
    return counts


def profile(server: servers.Server, body: Path, seconds: float) -> tuple[Counter, dict]:
    ep = server.endpoints["mlp"]
    url = server.base_url + ep.path
    run_wrk(url, str(body), connections=32, seconds=3, server_pid=server.proc.pid)
    out = Path(f"/tmp/tfservo-profile-{server.port}.raw")
    load: dict = {}
    worker = threading.Thread(target=lambda: load.update(
        run_wrk(url, str(body), connections=32, seconds=seconds + 2, server_pid=server.proc.pid)))
    worker.start()
    subprocess.run(
        [str(PY_SPY), "record", "--pid", str(server.proc.pid), "--duration", str(int(seconds)), "--rate", "250",
         "--gil", "--threads", "--nonblocking", "--format", "raw", "--output", str(out)],
        check=True, capture_output=True,
    )
    worker.join()
    return categorize(out.read_text()), load


def main(workdir: Path, results: Path, quick: bool) -> None:
    from serving import BATCHING

    bundle = str(workdir / "models" / "mlp")
    body = workdir / "bodies" / "mlp.tfs.json"
    seconds = 4.0 if quick else 10.0
    rows, notes = [], []
    for batching in (None, BATCHING["mlp"]):
        server = servers.tfservo("mlp", bundle, batching=batching, workers=1)
        server.start(results / "logs")
        try:
            counts, load = profile(server, body, seconds)
        finally:
            server.stop()
        total = sum(counts.values())
        possible = seconds * 250
        notes.append(
            f"- {server.name}: {load.get('rps', 0):.0f} req/s during the profile; the GIL was held in "
            f"{total / possible:.0%} of samples ({total} of ~{possible:.0f})."
        )
        for name, _ in CATEGORIES + [("other", "")]:
            rows.append({"configuration": server.name, "stage": name, "share of GIL-holding samples": f"{counts[name] / max(total, 1):.1%}"})
    doc = {
        "title": "Where tfservo's time goes: MLP, concurrency 32, one worker (py-spy --gil)",
        "rows": rows,
        "notes": ["Samples of the thread holding the GIL, each put in the first stage found from the innermost "
                  "frame out (bench/profile_tfservo.py)."] + notes,
    }
    (results / "profile.json").write_text(json.dumps(doc, indent=1))
    print("\n".join(notes))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), "--quick" in sys.argv)
