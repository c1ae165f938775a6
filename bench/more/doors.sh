#!/usr/bin/env bash
# Every HTTP door (issue 28): :predict, /invocations, the runtime API and V2 infer, defaults vs batching off.
set -euo pipefail
cd "$(dirname "$0")/.."
../.venv/bin/python doors_bench.py "$WORK" "$RESULTS" "$@"
