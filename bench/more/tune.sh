#!/usr/bin/env bash
# tfservo tune against an exhaustive sweep (MLP and ResNet-50), and Ray Serve against tfservo serve on the
# same cores (issue 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python tune_bench.py "$WORK" "$RESULTS" "$@"
../.venv/bin/python ray_serve_bench.py "$WORK" "$RESULTS" "$@"
