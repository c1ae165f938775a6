#!/usr/bin/env bash
# Transform on the local engine vs Ray vs Spark (issue 12), same machine, same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/cluster_bench.py "$WORK" "$RESULTS" "$@"
