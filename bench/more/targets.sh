#!/usr/bin/env bash
# Issue 28's MLP targets with the servers side by side: defaults, the HTTP floor and PyTriton driven in turns.
set -euo pipefail
cd "$(dirname "$0")/.."
../.venv/bin/python targets_bench.py "$WORK" "$RESULTS" "$@"
