"""Handlers that reach the model over TF Serving's gRPC API (`context.channel`, as the SageMaker
container gives them) work in `tfservo transform` (both runners) and in the Beam handler: the
loopback server in-process callers start serves gRPC as well as REST."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from server_process import run_cli
from transform_jobs import HALF_PLUS_THREE, INSURANCE, lines, write

from tfservo.batch.engines.beam import run_beam_transform
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import load_service
from tfservo.batch.worker.loaded import LoadedBundle, Selection

GRPC_HANDLER = '''
import json

import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


def handler(data, context):
    """CSV lines of values → predictions asked for through context.channel (TF Serving's gRPC API)."""
    values = [float(line.split(",")[-1]) for line in data.read().decode().splitlines() if line]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = context.model_name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(values, dtype=tf.float32))
    assert context.grpc_uri == f"127.0.0.1:{context.grpc_port}", context.grpc_uri
    stub = prediction_service_pb2_grpc.PredictionServiceStub(context.channel)
    response = stub.Predict(request, timeout=30)
    return json.dumps({"predictions": list(response.outputs["y"].float_val)}), "application/json"
'''
FLAGS = ["--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line", "--input-filter", "$[1:]",
         "--join-source", "Input", "--output-filter", "$[0,-1]", "--max-payload", "0.0002"]


@pytest.fixture(scope="module")
def grpc_job(tmp_path_factory) -> tuple[Path, Path]:
    """A half_plus_three bundle whose inference.py predicts over gRPC, and CSV quotes for it."""
    root = tmp_path_factory.mktemp("grpc-handler")
    bundle = root / "bundle"
    shutil.copytree(HALF_PLUS_THREE / "00000123", bundle / "half_plus_three" / "00000123")
    write(bundle / "code" / "inference.py", textwrap.dedent(GRPC_HANDLER))
    write(root / "in" / "quotes.csv", "".join(f"Q{i},{i}.5\n" for i in range(60)))
    write(root / "in" / "more" / "few.csv", "A,1\n\nB,2\n")
    return bundle, root / "in"


def expected(source: Path) -> dict[str, list[str]]:
    """id,prediction (y = x/2 + 3) per input line; blank lines stay blank."""
    out = {}
    for path in source.rglob("*.csv"):
        rows = [line.split(",") if line else None for line in lines(path)]
        out[str(path.relative_to(source))] = [f"{r[0]},{float(r[1]) / 2 + 3}" if r else "" for r in rows]
    return out


def outputs(root: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(root))[:-len(".out")]: lines(p) for p in root.rglob("*.out")}


def test_tfservo_transform_gives_handlers_a_grpc_channel(grpc_job, tmp_path):
    bundle, source = grpc_job
    done = run_cli(["transform", str(bundle), str(source), str(tmp_path / "out"), *FLAGS, "--progress", "none"])
    assert done.returncode == 0, done.stderr.decode()
    assert outputs(tmp_path / "out") == expected(source)


def test_both_engines_in_process_and_the_service_is_left_as_it_was(grpc_job, tmp_path):
    bundle, source = grpc_job
    service = load_service(str(bundle))
    try:
        summary = run_transform(TransformJob(str(bundle), str(source), str(tmp_path / "local"), **INSURANCE,
                                             max_payload_mb=0.0002), service=service, progress="none")
        assert summary.ok and summary.records == 63, summary.failed
        assert (service.rest_base, service.grpc_port) == (None, None)  # the loopback server is gone
    finally:
        service.close()
    assert outputs(tmp_path / "local") == expected(source)
    summary = run_beam_transform(TransformJob(str(bundle), str(source), str(tmp_path / "beam"), **INSURANCE,
                                              max_payload_mb=0.0002))
    assert summary.ok, summary.failed
    assert outputs(tmp_path / "beam") == expected(source)


def test_the_beam_handler_gives_handlers_a_grpc_channel(grpc_job):
    bundle, _ = grpc_job
    loaded = LoadedBundle(str(bundle), Selection(content_type="text/csv"))
    try:
        assert loaded.invoke(b"a,1.0\nb,5.0\n") == b'{"predictions": [3.5, 5.5]}'
    finally:
        loaded.close()
