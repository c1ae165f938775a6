"""Model lifecycle: TF Serving's model config file, version policies and labels, file-system
polling while serving, and warmup replay — on a real `tfservo serve` process."""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import TFS
from server_process import ServerProcess

from tfservo.core.errors import AlreadyExists, InvalidArgument
from tfservo.models.model_config import (
    VersionPolicy,
    parse_model_server_config,
    read_model_config_file,
)

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu" / "00000123"
POLL_SECONDS = 0.3


# -- models built for these tests --------------------------------------------------------------


def save_offset_model(path: Path, offset: float) -> None:
    """A TF2 SavedModel computing y = x + offset, so answers tell the versions apart."""
    import tensorflow as tf

    class Offset(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.offset = tf.Variable(offset, dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x + self.offset}

    module = Offset()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def save_slow_model(path: Path) -> None:
    """A TF2 SavedModel whose call takes as long as its input `n` says: y = x (after n matmuls)."""
    import tensorflow as tf

    class Slow(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.eye(128) * 0.5)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32, name="x"),
                tf.TensorSpec([], tf.int32, name="n"),
            ]
        )
        def serve(self, x, n):
            _, m = tf.while_loop(
                lambda i, m: i < n, lambda i, m: (i + 1, tf.matmul(m, self.w) * 2.0), (0, tf.ones([128, 128]))
            )
            return {"y": x + tf.reduce_mean(m) - 1.0}

    module = Slow()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def float_example(**features: float):
    import tensorflow as tf

    feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in features.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature))


def write_warmup(version_dir: Path, records: list) -> Path:
    """assets.extra/tf_serving_warmup_requests with the given PredictionLogs (or raw bytes)."""
    import tensorflow as tf

    path = version_dir / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record if isinstance(record, bytes) else record.SerializeToString())
    return path


def predict_log(signature: str, **inputs: float):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=tf.float32))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def example_logs() -> list:
    """regress, classify (with context) and multi-inference records for half_plus_two."""
    from tensorflow_serving.apis import (
        classification_pb2,
        inference_pb2,
        prediction_log_pb2,
        regression_pb2,
    )

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.signature_name = "regress_x_to_y"
    regress.input.example_list.examples.extend([float_example(x=1.0), float_example(x=4.0)])
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classify_x_to_y"
    with_context = classify.input.example_list_with_context
    with_context.context.CopyFrom(float_example(x2=1.0))
    with_context.examples.extend([float_example(x=2.0)])
    multi = inference_pb2.MultiInferenceRequest()
    for method, signature in (("regress", "regress_x_to_y"), ("classify", "classify_x_to_y")):
        task = multi.tasks.add()
        task.model_spec.signature_name = signature
        task.method_name = f"tensorflow/serving/{method}"
    multi.input.example_list.examples.extend([float_example(x=3.0)])
    log = prediction_log_pb2
    return [
        log.PredictionLog(regress_log=log.RegressLog(request=regress)),
        log.PredictionLog(classify_log=log.ClassifyLog(request=classify)),
        log.PredictionLog(multi_inference_log=log.MultiInferenceLog(request=multi)),
    ]


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict[str, Path]:
    """Model dirs under a tmp root (copies of the shared test models plus built ones)."""
    root = tmp_path_factory.mktemp("lifecycle")
    staging = root / "staging"
    save_offset_model(staging / "1", 100.0)
    save_offset_model(staging / "2", 200.0)

    save_slow_model(root / "slow" / "1")

    rolling = root / "rolling"
    rolling.mkdir()
    shutil.copytree(staging / "1", rolling / "1")

    labelled = root / "labelled"
    for version in ("00000123", "00000124", "00000125"):
        shutil.copytree(TFS / "saved_model_half_plus_two_2_versions" / "00000124", labelled / version)

    counter = root / "counter"
    shutil.copytree(TFS / "saved_model_counter" / "00000123", counter / "1")
    write_warmup(counter / "1", [predict_log("incr_counter_by", delta=d) for d in (1.0, 2.0, 3.0)])

    warm = root / "warm"
    shutil.copytree(HALF_PLUS_TWO, warm / "1")
    write_warmup(warm / "1", [predict_log("serving_default", x=[1.0, 2.0]), *example_logs()])

    garbage = root / "garbage_warmup"
    shutil.copytree(HALF_PLUS_TWO, garbage / "1")
    warmup = garbage / "1" / "assets.extra" / "tf_serving_warmup_requests"
    warmup.parent.mkdir()
    warmup.write_bytes(b"this is not a TFRecord file at all")

    bad_record = root / "bad_record"
    shutil.copytree(HALF_PLUS_TWO, bad_record / "1")
    write_warmup(bad_record / "1", [predict_log("serving_default", x=[1.0]), predict_log("nope", x=[1.0])])

    config = root / "models.config"
    config.write_text(textwrap.dedent(f"""
        model_config_list {{
          config {{ name: 'rolling' base_path: '{rolling}' model_platform: 'tensorflow'
                   model_version_policy {{ latest {{ num_versions: 1 }} }} }}
          config {{ name: 'labelled' base_path: '{labelled}'
                   model_version_policy {{ specific {{ versions: 123 versions: 124 }} }}
                   version_labels {{ key: 'stable' value: 123 }}
                   version_labels {{ key: 'canary' value: 124 }} }}
          config {{ name: 'counter' base_path: '{counter}' }}
          config {{ name: 'warm' base_path: '{warm}' }}
          config {{ name: 'garbage_warmup' base_path: '{garbage}' }}
          config {{ name: 'bad_record' base_path: '{bad_record}' }}
        }}
    """))
    return {"root": root, "staging": staging, "rolling": rolling, "config": config}


@pytest.fixture(scope="module")
def server(layout):
    with ServerProcess(
        ["--model-config-file", str(layout["config"]), "--file-system-poll-wait-seconds", str(POLL_SECONDS)]
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    with server.client() as c:
        yield c


def states(client: httpx.Client, name: str) -> dict[int, tuple[str, str]]:
    doc = client.get(f"/v1/models/{name}").json()
    return {
        int(v["version"]): (v["state"], v["status"]["error_message"]) for v in doc["model_version_status"]
    }


# -- model config file -------------------------------------------------------------------------


def test_specific_versions_policy_serves_only_those(client):
    assert {v: s for v, (s, _) in states(client, "labelled").items()} == {123: "AVAILABLE", 124: "AVAILABLE"}


def test_version_labels_route_to_their_versions(client):
    for label, version in (("stable", 123), ("canary", 124)):
        status = client.get(f"/v1/models/labelled/labels/{label}").json()
        assert [v["version"] for v in status["model_version_status"]] == [str(version)]
        r = client.post(f"/v1/models/labelled/labels/{label}:predict", json={"instances": [1.0, 2.0]})
        assert r.status_code == 200 and r.json() == {"predictions": [2.5, 3.0]}
    r = client.post("/v1/models/labelled/labels/nightly:predict", json={"instances": [1.0]})
    assert r.status_code == 404 and "nightly" in r.json()["error"]


def test_default_policy_is_latest_one(client):
    assert {v: s for v, (s, _) in states(client, "rolling").items()} == {1: "AVAILABLE"}


def test_config_errors_name_the_file_and_model(tmp_path):
    from server_process import run_cli

    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { name: 'm' base_path: '/no/such/dir' } }")
    done = run_cli(["serve", "--model-config-file", str(bad), "--port", "0", "--grpc-port", "0"])
    assert done.returncode != 0
    err = done.stderr.decode()
    assert str(bad) in err and "/no/such/dir" in err and "model m" in err

    bad.write_text("model_config_list { config { name: 'm' base_pth: '/x' } }")
    not_valid = f"Error parsing text-format tensorflow.serving.ModelServerConfig.*base_pth.*model config file {bad}"
    with pytest.raises(InvalidArgument, match=not_valid):
        read_model_config_file(str(bad))
    for text, needle in (
        ("model_config_list { config { name: 'm' base_path: '/x' model_platform: 'onnx' } }", "'onnx'"),
        ("model_config_list { config { name: 'm' base_path: 's3://b/m' } }", "local disk"),
        ("model_config_list { config { name: 'a b' base_path: '/x' } }", "'a b' is not valid"),
        ("model_config_list { config { name: 'm' base_path: '/x' model_version_policy { specific {} } } }",
         "no versions"),
        ("model_config_list { config { name: 'm' base_path: '/x' } config { name: 'm' base_path: '/y' } }",
         "names model m twice"),
    ):
        with pytest.raises(InvalidArgument, match=needle):
            parse_model_server_config(text)


# -- warmup ------------------------------------------------------------------------------------


def test_warmup_predict_records_are_replayed_before_available(client):
    assert states(client, "counter") == {1: ("AVAILABLE", "")}
    # The counter's variable saw the three warmup increments (1 + 2 + 3) before any request.
    body = {"signature_name": "incr_counter_by", "inputs": {"delta": 0.0}}
    r = client.post("/v1/models/counter:predict", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"outputs": 6.0}


def test_warmup_replays_regress_classify_and_multi_inference(server, client):
    assert states(client, "warm") == {1: ("AVAILABLE", "")}
    assert "model warm version 1: replayed 4 warmup request(s)" in server.output


def test_unreadable_warmup_file_fails_the_version_clearly(client):
    state, error = states(client, "garbage_warmup")[1]
    assert state == "END"
    assert "tf_serving_warmup_requests" in error and "model garbage_warmup version 1" in error
    assert "not a valid TFRecord" in error
    r = client.post("/v1/models/garbage_warmup:predict", json={"instances": [1.0]})
    assert r.status_code == 404 and "warmup" in r.json()["error"]


def test_failing_warmup_record_names_the_record(client):
    state, error = states(client, "bad_record")[1]
    assert state == "END"
    assert "record 2 (predict_log)" in error and "'nope'" in error


def test_ping_reports_the_failed_versions(client):
    assert client.get("/ping").status_code == 503


# -- polling -----------------------------------------------------------------------------------


def test_new_version_dir_goes_available_while_serving(layout, client):
    """Copy version 2 in (temp name, then rename) under steady traffic: no request fails."""
    results: dict[int, list[tuple[int, object]]] = {i: [] for i in range(3)}
    stop = threading.Event()

    def traffic(i: int) -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
            while not stop.is_set():
                r = c.post("/v1/models/rolling:predict", json={"instances": [1.0]})
                results[i].append((r.status_code, r.json()))

    threads = [threading.Thread(target=traffic, args=(i,)) for i in results]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        rolling = layout["rolling"]
        shutil.copytree(layout["staging"] / "2", rolling / "incoming-2")
        os.rename(rolling / "incoming-2", rolling / "2")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if states(client, "rolling") == {1: ("END", ""), 2: ("AVAILABLE", "")}:
                break
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert states(client, "rolling") == {1: ("END", ""), 2: ("AVAILABLE", "")}
    for answers in results.values():
        failures = [r for r in answers if r[0] != 200]
        assert not failures, failures[:5]
        values = [body["predictions"][0] for _, body in answers]
        assert values[0] == 101.0 and values[-1] == 201.0
        switch = values.index(201.0)
        assert set(values[:switch]) == {101.0} and set(values[switch:]) == {201.0}  # one clean switch


# -- reloading the config in-process (what gRPC's HandleReloadConfigRequest calls) -------------


def test_reload_config_adds_updates_and_removes_models(layout, tmp_path):
    from tfservo.service.factory import ModelService

    labelled = layout["root"] / "labelled"
    service = ModelService()
    try:
        service.model_config.reload_config(
            f"model_config_list {{ config {{ name: 'a' base_path: '{labelled}' }} }}"
        )
        assert [v.version for v in service.manager.model("a").available()] == [125]
        service.model_config.reload_config(f"""
            model_config_list {{
              config {{ name: 'a' base_path: '{labelled}' model_version_policy {{ all {{}} }}
                       version_labels {{ key: 'old' value: 123 }} }}
              config {{ name: 'b' base_path: '{HALF_PLUS_TWO.parent}' }}
            }}""")
        assert [v.version for v in service.manager.model("a").available()] == [123, 124, 125]
        assert service.manager.resolve("a", label="old").version == 123
        assert service.manager.model_names() == ["a", "b"]

        service.model_config.reload_config(
            f"model_config_list {{ config {{ name: 'b' base_path: '{HALF_PLUS_TWO.parent}' }} }}"
        )
        assert service.manager.model_names() == ["b"]
        assert service.model_config.model_names() == ["b"]

        with pytest.raises(InvalidArgument, match="version label 'x' of model b points at version 7"):
            service.model_config.reload_config(
                f"model_config_list {{ config {{ name: 'b' base_path: '{HALF_PLUS_TWO.parent}' "
                "version_labels { key: 'x' value: 7 } } }"
            )
        service.add_bundle(str(layout["rolling"]))
        with pytest.raises(AlreadyExists, match="model rolling"):
            service.model_config.reload_config(
                f"model_config_list {{ config {{ name: 'rolling' base_path: '{labelled}' }} }}"
            )
    finally:
        service.close()


def test_version_policies_select_like_tf_serving():
    found = [3, 1, 10, 2]
    assert VersionPolicy.latest(1).select(found) == {10}
    assert VersionPolicy.latest(0).select(found) == {10}  # TF Serving serves at least one
    assert VersionPolicy.latest(2).select(found) == {3, 10}
    assert VersionPolicy.all().select(found) == {1, 2, 3, 10}
    assert VersionPolicy.specific([2, 7]).select(found) == {2}
    assert VersionPolicy.latest(1).select([]) == set()


def test_unload_waits_for_calls_in_flight(layout):
    """A version retired mid-call finishes that call before its session is closed."""
    import numpy as np

    from tfservo.core.errors import NotFound
    from tfservo.service.factory import ModelService

    service = ModelService()
    service.add_bundle(str(layout["root"] / "slow"))
    inputs = {"x": np.array([1.0, 2.0], np.float32), "n": np.array(8000, np.int32)}
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["y"] = service.api.predict("slow", None, None, "", inputs).outputs["y"].tolist()
        except Exception as exc:
            outcome["error"] = exc
        outcome["done"] = time.monotonic()

    try:
        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.15)
        service.manager.unload_version("slow", 1)
        unloaded = time.monotonic()
        thread.join()
        assert "error" not in outcome, outcome
        assert outcome["y"] == [1.0, 2.0]
        assert unloaded >= outcome["done"]
        assert service.manager.model("slow").versions[1].state.value == "END"
        with pytest.raises(NotFound):
            service.api.predict("slow", None, None, "", inputs)
    finally:
        service.close()
