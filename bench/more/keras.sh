#!/usr/bin/env bash
# Keras 3 .keras files against their exported SavedModels (MLP, small CNN; 1 and 32 clients), and the scan's and the signature check's cost on ResNet-50's load (issue 63).
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python keras_bench.py "$WORK" "$RESULTS" "$@"
