#!/usr/bin/env bash
# gRPC (issue 28): tfservo's Predict and V2 ModelInfer beside a do-nothing server on the same gRPC stack.
set -euo pipefail
cd "$(dirname "$0")/.."
../.venv/bin/python grpc_floor.py "$WORK" "$RESULTS" "$@"
