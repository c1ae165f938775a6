#!/usr/bin/env bash
# Data Capture, the payload logger and tracing against none of them (issue 24), same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python observability_bench.py "$WORK" "$RESULTS" "$@"
