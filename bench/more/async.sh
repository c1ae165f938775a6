#!/usr/bin/env bash
# Asynchronous inference (issue 27): a backlog of ~1 MB JPEGs vs /invocations, same server, same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/async_bench.py "$WORK" "$RESULTS" "$@"
