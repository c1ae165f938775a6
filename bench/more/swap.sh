#!/usr/bin/env bash
# A model swap under a steady streaming load: Beam DirectRunner (streaming), 500 MLP elements/s (issue 26).
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python swap_bench.py "$WORK" "$RESULTS" "$@"
