#!/usr/bin/env bash
# Following a prefix (issue 26): seconds from an object landing to its .out, in polls.
set -euo pipefail
cd "$(dirname "$0")/.."
../.venv/bin/python follow_bench.py "$WORK" "$RESULTS" "$@"
