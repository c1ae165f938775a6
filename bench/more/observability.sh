#!/usr/bin/env bash
# Data Capture and the payload logger against neither (issue 24), same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python observability_bench.py "$WORK" "$RESULTS" "$@"
