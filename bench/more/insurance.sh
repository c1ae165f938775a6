#!/usr/bin/env bash
# Insurance-style CSV transform (issue 10): this checkout vs a baseline commit, in the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/insurance_bench.py "$WORK" "$RESULTS" "$@"
