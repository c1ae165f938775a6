"""Kubernetes manifests checked against their API schemas, by kubernetes-models' validators
(npm; tests/k8s, installed by ./scripts/system-deps test), since no cluster runs here."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

HERE = Path(__file__).with_name("k8s")

__all__ = ["schema_errors"]


def schema_errors(*paths: Path) -> dict[str, str | None]:
    """'kind name' → the schema's complaint (None: valid) for every object in the YAML files."""
    node = shutil.which("node")
    assert node, "node is not installed: run ./scripts/system-deps test"
    assert (HERE / "node_modules" / "kubernetes-models").is_dir(), "run ./scripts/system-deps test (npm ci in tests/k8s)"
    objects = [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]
    out = subprocess.run([node, str(HERE / "validate.mjs")], input=json.dumps(objects), capture_output=True,
                         text=True, timeout=120, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len(objects), out
    return {f"{line['kind']} {line['name']}": line["error"] for line in lines}
