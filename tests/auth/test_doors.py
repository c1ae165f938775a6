"""The start-up line says which doors are open to whom; a server other hosts can reach that
checks no one warns, except inside SageMaker (its front end authenticates); test_management.py
sees the warning from a real server."""

from __future__ import annotations

import logging

from conftest import SMC

from tfservo.auth.doors import access_line
from tfservo.auth.keys import add_key
from tfservo.core.settings import resolve_settings

MODEL = str(SMC / "resources" / "models" / "half_plus_three")


def test_the_line_names_each_doors_guard(tmp_path):
    keys = str(tmp_path / "keys.json")
    add_key(keys, "k", ["invoke"])
    level, line = access_line(resolve_settings(paths=[MODEL], env={}, host="127.0.0.1"))
    assert level == logging.INFO and "runtime API open; other doors open" in line and "this host only" in line
    level, line = access_line(resolve_settings(paths=[MODEL], env={}, host="0.0.0.0", api_keys=keys))
    assert level == logging.INFO and f"API keys with scopes from {keys}" in line and "other hosts too" in line
    level, line = access_line(resolve_settings(paths=[MODEL], env={"SAGEMAKER_BIND_TO_PORT": "8080"}))
    assert level == logging.INFO  # inside SageMaker: 0.0.0.0, and the platform authenticates
