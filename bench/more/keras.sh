#!/usr/bin/env bash
# Keras 3 .keras files against their exported SavedModels (MLP, small CNN; 1 and 32 clients), the scan's and
# the signature check's cost on ResNet-50's load, and Keras on JAX against TensorFlow (issue 63).
set -euo pipefail
cd "$(dirname "$0")/../.."
cd bench && ../.venv/bin/python keras_bench.py "$WORK" "$RESULTS" "$@"
../.venv/bin/python keras_jax_bench.py "$WORK" "$RESULTS" --jax-python .venv-jax/bin/python
