#!/usr/bin/env bash
# Batch-transform benchmark (issue 5 part 6): tfservo transform vs raw calls vs Beam RunInference.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! .venv/bin/tfservo transform --help >/dev/null 2>&1; then
  echo "bench: tfservo transform is not available; skipping the transform benchmark"
  exit 0
fi
.venv/bin/python bench/transform_bench.py "$WORK" "$RESULTS" "$@"
