#!/usr/bin/env bash
# Insurance-style CSV transform: this checkout vs a baseline commit, in the same run — e76b8e9
# (before issue 10's data plane) and 541a753 (before issue 28's Arrow columns).
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/insurance_bench.py "$WORK" "$RESULTS" "$@"
.venv/bin/python bench/insurance_bench.py "$WORK" "$RESULTS" --baseline 541a753 "$@"
