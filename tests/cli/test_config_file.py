"""`serve --config FILE` and `tensorflow_model_server --config=FILE`: settings from TOML, YAML or
JSON by their flags' names or their variables', under the command line's flags and over the
environment; an unknown key or a wrong type stops the start naming the file and the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TFS
from server_process import ServerProcess, run_cli

from tfservo.cli.tfs import settings_from_tfs_args
from tfservo.core.config_file import read_config_file
from tfservo.core.settings import ConfigError

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
TFMS = str(Path(sys.executable).with_name("tensorflow_model_server"))


def test_serve_starts_from_the_file_under_its_flags_and_over_the_environment(tmp_path):
    config = tmp_path / "tuned.toml"
    config.write_text(f'''
paths = ["{HALF_PLUS_TWO}"]
batching = "timeout"
intra-op-threads = 1
port = 1            # the command line's --port 0 wins
log-level = "debug" # over TFSERVO_LOG_LEVEL below
SAGEMAKER_TFS_MAX_BATCH_SIZE = 4
''')
    with ServerProcess(["--config", str(config), "--no-supervisor"], env={"TFSERVO_LOG_LEVEL": "warning"}) as proc, \
            proc.client() as http:
        got = http.post("/v1/models/saved_model_half_plus_two_cpu:predict", json={"instances": [1.0, 2.0]})
        assert got.json() == {"predictions": [2.5, 3.0]}, got.text
    [serving] = [line for line in proc.lines if " serving " in line]
    assert "batching: timeout" in serving and "1 TF thread(s)" in serving, serving
    assert any(" DEBUG " in line for line in proc.lines), proc.output


def test_a_misspelt_key_or_a_wrong_type_stops_serve_naming_the_file_and_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("wokers = 2\n")
    done = run_cli(["serve", "--config", str(bad)])
    assert done.returncode == 2
    assert f"{bad}: unknown setting 'wokers'; did you mean workers" in done.stderr.decode(), done.stderr.decode()
    bad.write_text('workers = "two"\n')
    done = run_cli(["serve", "--config", str(bad)])
    assert done.returncode == 2 and "workers is a whole number, got 'two'" in done.stderr.decode()
    broken = tmp_path / "broken.toml"
    broken.write_text("workers = \n")
    done = run_cli(["serve", "--config", str(broken)])
    assert done.returncode == 2 and f"{broken} does not parse" in done.stderr.decode()


def test_yaml_and_json_say_the_same_as_toml(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('workers = 2\nbatching-eager = true\ntrust-model-code = false\nversion-label = ["m:stable=1"]\n')
    yaml = tmp_path / "c.yaml"
    yaml.write_text("workers: 2\nbatching-eager: true\ntrust-model-code: false\nversion-label: [m:stable=1]\n")
    doc = tmp_path / "c.json"
    doc.write_text(json.dumps({"workers": 2, "batching_eager": True, "trust_model_code": False,
                               "version_label": ["m:stable=1"]}))
    read = [read_config_file(str(p)) for p in (toml, yaml, doc)]
    assert all(r.flags == read[0].flags and r.env == read[0].env for r in read), read
    assert read[0].flags == {"workers": 2, "batching_eager": True, "version_labels": ("m:stable=1",)}
    assert read[0].env == {"TFSERVO_TRUST_MODEL_CODE": "false"}  # off, said over the environment's
    (tmp_path / "c.ini").write_text("")
    with pytest.raises(ConfigError, match="ends in .toml, .yaml, .yml or .json"):
        read_config_file(str(tmp_path / "c.ini"))


def test_tensorflow_model_server_reads_its_own_flags_and_serves_from_the_file(tmp_path):
    config = tmp_path / "tfs.yaml"
    config.write_text(f"model_name: half\nmodel_base_path: {HALF_PLUS_TWO}\nrest_api_port: 1\nworkers: 1\n"
                      "enable_batching: true\nSAGEMAKER_TFS_MAX_BATCH_SIZE: 3\n")
    settings = settings_from_tfs_args([f"--config={config}", "--rest_api_port=8123"], env={})
    assert (settings.port, settings.model_name, settings.workers) == (8123, "half", 1)
    assert settings.batching is not None and settings.batching.max_batch_size == 3
    tfms = ServerProcess([])
    tfms.args = [TFMS, "--config", str(config), "--port=0", "--rest_api_port=0"]
    with tfms, tfms.client() as http:
        assert http.post("/v1/models/half:predict", json={"instances": [1.0]}).json() == {"predictions": [2.5]}
