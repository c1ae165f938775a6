"""The image test reuses the suite's helpers: tests/conftest.py, loaded under another name."""

import importlib.util
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(_TESTS))
_spec = importlib.util.spec_from_file_location("tfservo_suite_conftest", _TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)

TFS = _suite.TFS
grpc_predict_request = _suite.grpc_predict_request
tfs_grpc = _suite.tfs_grpc
