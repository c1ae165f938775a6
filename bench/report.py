"""Write docs/performance.md from bench/results/*.json: machine facts, the ceiling, every run as
ratios to the ceiling and to each peer, and the issue's targets checked.

Usage: python bench/report.py RESULTS_DIR OUT.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The floor is a do-nothing app on tfservo's HTTP stack (bench/floor_app.py), measured in the same run.
PEERS = [("floor", "floor"), ("pytriton", "PyTriton"), ("kserve", "KServe"), ("fastapi", "FastAPI")]
TITLES = {
    "mlp": "MLP 784-256-256-10, one 1×784 JSON instance per request",
    "resnet_b64": "ResNet-50, one base64 JPEG per request through code/inference.py (PyTriton, KServe, FastAPI: decoded in their Python code)",
    "resnet_float": "ResNet-50, one 224×224×3 image as float JSON per request",
}


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.2f}×"


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def _peer_runs(runs: list[dict], workload: str, c: int) -> dict[str, dict]:
    return {r["family"]: r for r in runs if r.get("workload") == workload and r["concurrency"] == c
            and r["family"] != "tfservo"}


def workload_table(runs: list[dict], workload: str, c: int, ceiling: dict) -> list[str]:
    rows = [r for r in runs if r.get("workload") == workload and r["concurrency"] == c]
    peers = _peer_runs(runs, workload, c)
    model = "mlp" if workload == "mlp" else "resnet"
    ceil_rps = ceiling[model]["ceiling_rows_per_s"]
    ceil_p50 = ceiling[model]["batch1_p50_ms"]
    ceil_eff = ceiling[model].get("ceiling_rows_per_cpu_s")
    head = ["server", "req/s", "× ceiling"] + [f"× {label}" for _, label in PEERS] + [
        "req per CPU-s", "× ceiling per CPU-s"] + [
        "p50 ms", "p50 − in-process ms", "p99 ms"] + [f"p99 × {label}" for _, label in PEERS] + [
        "errors", "server CPU (cores)", "other load (cores)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["server"], _fmt(r["rps"], 1), _ratio(r["rps"], ceil_rps)]
        cells += [_ratio(r["rps"], peers.get(f, {}).get("rps")) if f != r["family"] else "–" for f, _ in PEERS]
        eff = r["rps"] / r["server_cores"] if r["server_cores"] else None
        cells += [_fmt(eff, 1) if eff else "–", _ratio(eff, ceil_eff)]
        cells += [_fmt(r["p50_ms"]), _fmt(r["p50_ms"] - ceil_p50), _fmt(r["p99_ms"])]
        cells += [_ratio(r["p99_ms"], peers.get(f, {}).get("p99_ms")) if f != r["family"] else "–" for f, _ in PEERS]
        cells += [str(r["errors"]), _fmt(r["server_cores"]), _fmt(r["other_cores"])]
        out.append("| " + " | ".join(cells) + " |")
    unlike = sorted({r.get("cpu", "an unrecorded CPU") for r in rows if not _like(r, ceiling[model])})
    if unlike:
        out += ["", f"The ceiling ran on {ceiling[model].get('cpu', 'an unrecorded CPU')}; rows of this table ran on "
                f"{'; '.join(unlike)}: their ratios to it compare unlike machines."]
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def _like(run: dict, ceiling_doc: dict) -> bool:
    """Whether `run` was measured on the CPU its ceiling was (serving.cpu()): this machine's
    hosts differ from one session to the next, and TensorFlow's speed with them."""
    return run.get("cpu") is not None and run.get("cpu") == ceiling_doc.get("cpu")


def verdict_against(ok: bool, run: dict, ceiling_doc: dict) -> str:
    """A target against the in-process ceiling: judged only on the CPU the ceiling ran on."""
    if not _like(run, ceiling_doc):
        return f"not comparable: the ceiling ran on {ceiling_doc.get('cpu', 'an unrecorded CPU')}, this row on {run.get('cpu', 'an unrecorded CPU')}"
    return verdict(ok)


def targets(runs: list[dict], ceiling: dict, more: list[str] | None = None) -> list[str]:
    """The targets of issue 28 (defaults against the floor and PyTriton, then `more`: those
    other benchmarks measure), then the older ones for every tfservo configuration."""
    out = ["| target | tfservo configuration | measured | verdict |", "|---|---|---|---|"]
    ours = [r for r in runs if r.get("family") == "tfservo" and "workload" in r]

    def one(server: str, workload: str, c: int) -> dict | None:
        return next((r for r in ours if r["server"] == server and r["workload"] == workload and r["concurrency"] == c), None)

    defaults = "tfservo defaults"
    d32, floor32, tri32 = one(defaults, "mlp", 32), _peer_runs(runs, "mlp", 32).get("floor"), _peer_runs(runs, "mlp", 32).get("pytriton")
    if d32 and floor32 and tri32:
        ok = d32["rps"] >= 3 * tri32["rps"] and d32["rps"] >= 0.5 * floor32["rps"]
        out.append(f"| MLP c=32, defaults: ≥ 3× PyTriton and ≥ 50% of the HTTP floor | {defaults} | "
                   f"{d32['rps'] / tri32['rps']:.2f}× PyTriton, {d32['rps'] / floor32['rps']:.0%} of the floor | {verdict(ok)} |")
    ref = ceiling["mlp"]["batch1_p50_ms"]
    d1, off1 = one(defaults, "mlp", 1), one("tfservo batching off, 1 worker", "mlp", 1)
    if d1:
        out.append(f"| MLP c=1, defaults: p50 within 0.3 ms of the in-process call ({ref:.3f} ms) | {defaults} | "
                   f"p50 {d1['p50_ms']:.2f} ms (+{d1['p50_ms'] - ref:.2f} ms) | "
                   f"{verdict_against(d1['p50_ms'] - ref <= 0.3, d1, ceiling['mlp'])} |")
    if d1 and off1:
        extra = d1["p50_ms"] - off1["p50_ms"]
        out.append(f"| MLP c=1: the default batching adds ≤ 0.2 ms to batching off | {defaults} | "
                   f"{extra:+.2f} ms p50 | {verdict(extra <= 0.2)} |")
    for workload in ("resnet_b64", "resnet_float"):
        d8, tri8 = one(defaults, workload, 8), _peer_runs(runs, workload, 8).get("pytriton")
        if d8 and tri8:
            share = d8["rps"] / ceiling["resnet"]["ceiling_rows_per_s"]
            ok = share >= 0.95 and d8["rps"] >= 1.05 * tri8["rps"]
            out.append(f"| {workload} c=8, defaults: ≥ 0.95× in-process and ≥ 1.05× PyTriton | {defaults} | "
                       f"{share:.2f}× in-process, {d8['rps'] / tri8['rps']:.2f}× PyTriton | "
                       f"{verdict_against(ok, d8, ceiling['resnet'])} |")
    out += more or []
    tri32 = _peer_runs(runs, "mlp", 32).get("pytriton")
    for r in [r for r in ours if r["workload"] == "mlp" and r["concurrency"] == 32]:
        if tri32 is None:
            out.append(f"| MLP c=32: ≥ 2× PyTriton req/s, p99 ≤ PyTriton's | {r['server']} | no PyTriton run | – |")
            continue
        ok = r["rps"] >= 2 * tri32["rps"] and r["p99_ms"] <= tri32["p99_ms"]
        per_cpu = _ratio(r["rps"] / r["server_cores"], tri32["rps"] / tri32["server_cores"])
        out.append(
            f"| MLP c=32: ≥ 2× PyTriton req/s, p99 ≤ PyTriton's | {r['server']} | "
            f"{r['rps'] / tri32['rps']:.2f}× req/s ({per_cpu} per CPU-s), p99 {r['p99_ms']:.1f} vs "
            f"{tri32['p99_ms']:.1f} ms | {verdict(ok)} |"
        )
    ref = ceiling["mlp"]["batch1_p50_ms"]
    for r in [r for r in ours if r["workload"] == "mlp" and r["concurrency"] == 1]:
        gap = r["p50_ms"] - ref
        out.append(
            f"| MLP c=1: p50 within 1 ms of the in-process call ({ref:.3f} ms) | {r['server']} | "
            f"p50 {r['p50_ms']:.2f} ms (+{gap:.2f} ms) | {verdict_against(gap <= 1.0, r, ceiling['mlp'])} |"
        )
    ceil = ceiling["resnet"]["ceiling_rows_per_s"]
    ceil_eff = ceiling["resnet"].get("ceiling_rows_per_cpu_s")
    for r in [r for r in ours if r["workload"] == "resnet_b64"]:
        share = r["rps"] / ceil
        per_cpu = f" ({r['rps'] / r['server_cores'] / ceil_eff:.0%} per CPU-s)" if ceil_eff and r["server_cores"] else ""
        out.append(
            f"| ResNet-50 b64 JPEG ≥ 85% of in-process ({ceil:.2f} images/s) | {r['server']} | "
            f"{r['rps']:.2f} req/s = {share:.0%}{per_cpu} | {verdict_against(share >= 0.85, r, ceiling['resnet'])} |"
        )
    return out


def _times(cell: object) -> float | None:
    """A ratio cell such as "0.54×" as a number (None when absent)."""
    try:
        return float(str(cell).rstrip("×x"))
    except ValueError:
        return None


def extra_sections(results: Path) -> dict[str, dict]:
    """The sections other benchmarks wrote (RESULTS/NAME.json with a title and rows), by NAME."""
    sections = {}
    for path in sorted(results.glob("*.json")):
        if path.name not in ("ceiling.json", "serving.json"):
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and "title" in doc and isinstance(doc.get("rows"), list):
                sections[path.stem] = doc
    return sections


def other_targets(sections: dict[str, dict]) -> list[str]:
    """Issue 28's targets that other benchmarks measure (their own sections below): the serving
    targets with the servers side by side, gRPC against its floor, the insurance-style transform against
    its model, the clusters against the local engine."""
    out = [
        f"| {row['measure']} {row['target']} | tfservo defaults | {row['median of the rounds']} (median of "
        f"{row['rounds']} rounds, {row['lowest round']} to {row['highest round']}; bench/targets_bench.py) | "
        f"{row['verdict']} |"
        for row in sections.get("targets", {}).get("rows", [])
    ]
    for row in sections.get("grpc", {}).get("rows", []):
        if row.get("server") == "tfservo defaults" and row.get("call") == "TF Serving Predict":
            share = _times(row.get("× floor"))
            if share is not None:
                out.append(f"| gRPC Predict c=32: ≥ 50% of the gRPC floor | tfservo defaults | {share:.0%} of the floor "
                           f"(bench/grpc_floor.py) | {verdict(share >= 0.5)} |")
    for row in sections.get("insurance", {}).get("rows", []):
        if "(this checkout)" in str(row.get("way", "")):
            share = _times(row.get("× model only"))
            if share is not None:
                out.append(f"| insurance-style CSV transform: ≥ 30% of the model-only rate | local engine | {share:.2f}× "
                           f"model only (bench/insurance_bench.py) | {verdict(share >= 0.3)} |")
    for row in sections.get("clusters", {}).get("rows", []):
        if row.get("engine") == "local engine":
            continue
        images, records = _times(row.get("images × local")), _times(row.get("records × local"))
        if images is not None and records is not None:
            out.append(f"| clusters: images ≥ 0.9× and records ≥ 1× the local engine | {row['engine']} | images "
                       f"{images:.2f}×, records {records:.2f}× (bench/cluster_bench.py) | "
                       f"{verdict(images >= 0.9 and records >= 1.0)} |")
    return out


def ceiling_table(ceiling: dict) -> list[str]:
    out = []
    for model, doc in ceiling.items():
        paths = doc["call_paths"]
        batches = list(next(iter(paths.values()))["by_batch"])
        out.append(f"**{model}** — ceiling {doc['ceiling_rows_per_s']:,.1f} rows/s ({doc['ceiling_path']}, "
                   f"batch {doc['ceiling_batch']}); batch-1 call p50 {doc['batch1_p50_ms']:.3f} ms ({doc['batch1_path']}); "
                   f"on {doc.get('cpu', 'an unrecorded CPU')}")
        if "other_measurement" in doc:
            o = doc["other_measurement"]
            out.append("")
            out.append(f"Measured twice; the higher is the ceiling. The other measurement: "
                       f"{o['ceiling_rows_per_s']:,.1f} rows/s at batch {o['ceiling_batch']}, batch-1 p50 "
                       f"{o['batch1_p50_ms']:.3f} ms (other sessions' work was running).")
        out.append("")
        out.append("| call path | " + " | ".join(f"batch {b} rows/s (cores)" for b in batches) + " | batch-1 p50 ms |")
        out.append("|---|" + "---|" * (len(batches) + 1))
        for name, p in paths.items():
            cells = [f"{_fmt(p['by_batch'][b]['rows_per_s'], 1)} ({p['by_batch'][b].get('cpu_cores', 0):.2f})" for b in batches]
            out.append(f"| {name} | " + " | ".join(cells) + f" | {p['batch1_p50_ms']:.3f} |")
        out.append("")
    return out


def section_arguments() -> argparse.Namespace:
    """The command line of a benchmark that writes a section: WORKDIR RESULTS [--quick]."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("results")
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args()


def save_section(results: str | Path, name: str, doc: dict) -> None:
    """Write a benchmark's section as RESULTS/NAME.json (what `extra_section` reads) and print its rows."""
    Path(results, f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    for row in doc.get("rows") or []:
        print(row)


def extra_section(doc: dict) -> list[str]:
    """A section another benchmark wrote (e.g. bench/results/transform.json): title, rows, notes."""
    out = [f"### {doc.get('title', 'More results')}", ""]
    rows = doc.get("rows") or []
    if rows:
        head = list(rows[0])
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(str(r.get(h, "")) for h in head) + " |" for r in rows]
        out.append("")
    out += [str(n) for n in doc.get("notes", [])]
    return out + [""]


BEGIN = "<!-- bench/run: serving benchmark (generated by bench/report.py; edits here are overwritten) -->"
END = "<!-- bench/run: end of serving benchmark -->"


def write_section(out: Path, text: str) -> None:
    """Replace this benchmark's section of `out` (or add it); the rest of the file is kept."""
    block = f"{BEGIN}\n{text.rstrip()}\n{END}\n"
    old = out.read_text() if out.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1].lstrip("\n")
    elif old:
        new = old.rstrip() + "\n\n" + block
    else:
        new = "# Performance\n\n" + block
    out.write_text(new)


def render(results: Path) -> str:
    ceiling = json.loads((results / "ceiling.json").read_text())
    serving = json.loads((results / "serving.json").read_text())
    m, runs = serving["machine"], serving["runs"]
    sections = extra_sections(results)
    lines = [
        "## Serving: tfservo beside PyTriton, KServe and FastAPI",
        "",
        "Written by `./bench/run` (bench/report.py) from `bench/results/*.json`; rerun it to reproduce.",
        "Every server ran alone, one after another, on the machine below, driven by wrk with one",
        "connection per concurrent client (closed loop: each client sends its next request when",
        "the answer arrives). \"× ceiling\" divides requests/s by the in-process rows/s at the best",
        "batch size; \"× PEER\" divides by that peer's figure in the same table. \"other load\" is CPU",
        "that neither the server nor wrk used during the run (other processes on the machine).",
        "\"req per CPU-s\" divides requests/s by the CPU cores the server's process tree used; it is",
        "the fairer figure when other load took part of the machine, and its ratio compares it with",
        "the ceiling's rows per CPU-second. The \"floor\" rows are a do-nothing app",
        "(bench/floor_app.py) reading each body and answering the reference answer: on the HTTP",
        "stack tfservo serves with (uvicorn + httptools), the same through tfservo's protocol class",
        "(its time limits and connection cap), on granian (a Rust HTTP server for ASGI apps), and",
        "on a minimal HTTP/1.1 protocol on httptools that runs the app's coroutine in the parser's",
        "callback (`floor_app.py --lean`: what a leaner protocol than uvicorn's could cost; not a",
        "whole server): the candidate stacks measured against uvicorn. \"× floor\" divides by the",
        "first. \"tfservo defaults\" sets no batching or worker option at all.",
        "",
        "### Machine",
        "",
        "The facts of the last full run; the lines after them name each later rerun of some rows and the",
        "CPU it ran on (every row records its own).",
        "",
        "| | |",
        "|---|---|",
    ]
    for k, v in m.items():
        lines.append(f"| {k} | {v} |")
    for rerun in serving.get("reruns", []):
        m2 = rerun["machine"]
        lines.append(f"| re-measured later: {', '.join(rerun['only'])} | on {m2['cpu']}; load average "
                     f"{' '.join(m2['loadavg_at_start'])} at the start |")
    lines += ["", f"Batching settings (tfservo \"batching on\" and PyTriton's dynamic batcher): `{json.dumps(serving['batching'])}`", ""]
    lines += ["### Targets", "",
              "The serving targets appear twice: from the tables below, where each server ran once, minutes",
              "apart (a server's figure moves by ±20 % between such runs on this machine), and from",
              "bench/targets_bench.py, where the servers run side by side and each ratio is taken within one",
              "round of turns: the steadier figure (its section is further below).", ""] + targets(runs, ceiling, other_targets(sections)) + [""]
    lines += ["### Ceiling: in-process calls, no server", ""] + ceiling_table(ceiling)
    for workload, spec in serving["workloads"].items():
        for c in spec["concurrency"]:
            lines += [f"### {TITLES.get(workload, workload)} — concurrency {c}, {spec['seconds']:g} s", ""]
            lines += workload_table(runs, workload, c, ceiling) + [""]
    failed = [r for r in runs if "failed" in r]
    if failed:
        lines += ["### Runs that failed", ""] + [f"- {r['model']}: {r['server']}: {r['failed']}" for r in failed] + [""]
    for doc in sections.values():
        lines += extra_section(doc)  # written by a bench/more/*.sh hook
    analysis = Path(__file__).with_name("analysis.md")
    if analysis.exists():
        lines += [analysis.read_text().rstrip(), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    results_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    text = render(results_dir)
    write_section(out, text)
    print(f"wrote {out}")
    print(text[text.index("### Targets"):text.index("### Ceiling")].rstrip())  # the run ends with its verdicts
