#!/usr/bin/env bash
# Data Capture, the payload logger and tracing against none of them (issues 24 and 66), same run:
# throughput at saturation, server CPU per request at a paced load, and an unsampled request's
# tracing cost timed in one process.
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench
../.venv/bin/python observability_bench.py "$WORK" "$RESULTS" "$@"
../.venv/bin/python observability_cpu_bench.py "$WORK" "$RESULTS" "$@"
../.venv/bin/python tracing_unsampled_bench.py "$WORK" "$RESULTS" "$@"
