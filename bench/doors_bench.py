"""Every HTTP door at the same model: the MLP through TF Serving's :predict, SageMaker's
/invocations and its runtime API's /endpoints/{name}/invocations, and the V2 protocol's infer,
with tfservo's defaults and with batching off, at 32 clients and at one; configurations
interleaved, best of 2, in the same run. The doors share one decoder, batcher and encoder,
so with the defaults none should fall behind batching off (they once did: /invocations and V2
infer ran at half the batched rate).

Writes RESULTS/doors.json in the report's section format.

Usage: python bench/doors_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

from pathlib import Path

import servers
from load import run_wrk
from models import build_all
from report import save_section, section_arguments

DOORS = {  # name: (path, body file under WORKDIR/bodies)
    "TF Serving :predict": ("/v1/models/mlp:predict", "mlp.tfs.json"),
    "SageMaker /invocations": ("/invocations", "mlp.tfs.json"),
    "runtime API /endpoints/mlp/invocations": ("/endpoints/mlp/invocations", "mlp.tfs.json"),
    "V2 infer (JSON)": ("/v2/models/mlp/infer", "mlp.v2.json"),
}
CONCURRENCY = (32, 1)


def configurations(bundle: str) -> dict[str, servers.Server]:
    return {"defaults": servers.tfservo_defaults("mlp", bundle),
            "batching off": servers.tfservo("mlp", bundle, batching=None, workers=1)}


def main() -> None:
    args = section_arguments()
    seconds = 3.0 if args.quick else 8.0
    workdir = Path(args.workdir).resolve()
    paths = build_all(str(workdir))
    logs = Path(args.results) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    best: dict[tuple[str, str, int], dict] = {}
    for _ in range(2):  # interleaved: drift on a shared machine hits every configuration alike
        for config, server in configurations(paths["mlp"]).items():
            server.start(logs)
            try:
                for door, (path, body) in DOORS.items():
                    url, body_file = server.base_url + path, str(workdir / "bodies" / body)
                    run_wrk(url, body_file, connections=32, seconds=2, server_pid=server.proc.pid)  # warm
                    for c in CONCURRENCY:
                        result = run_wrk(url, body_file, connections=c, seconds=seconds, server_pid=server.proc.pid)
                        if result["errors"]:
                            raise RuntimeError(f"{config}, {door}: {result['error_kinds']}")
                        key = (door, config, c)
                        if key not in best or result["rps"] > best[key]["rps"]:
                            best[key] = result
                        print(f"{door}, {config}, c={c}: {result['rps']:.0f} req/s, p50 {result['p50_ms']:.2f} ms")
            finally:
                server.stop()
    rows = []
    for door in DOORS:
        on, off = best[(door, "defaults", 32)], best[(door, "batching off", 32)]
        rows.append({
            "door": door,
            "defaults, 32 clients (req/s)": round(on["rps"]),
            "batching off, 32 clients (req/s)": round(off["rps"]),
            "defaults ÷ off": f"{on['rps'] / off['rps']:.2f}x",
            "defaults, 1 client p50 ms": round(best[(door, "defaults", 1)]["p50_ms"], 3),
            "batching off, 1 client p50 ms": round(best[(door, "batching off", 1)]["p50_ms"], 3),
        })
    report = {
        "title": "Every HTTP door, the same MLP: defaults against batching off",
        "rows": rows,
        "notes": [
            f"tfservo serve, one worker; wrk {seconds:g} s per run on the last core, best of 2 interleaved "
            "rounds (bench/doors_bench.py). The doors share the decoder, the batcher and the encoders: what "
            "differs is each protocol's own parsing and answer.",
        ],
    }
    save_section(args.results, "doors", report)


if __name__ == "__main__":
    main()
