"""One bundle, one behaviour: every case of one table, sent through every front door, must get
the same bytes (or the same error status and message).

Modes: `tfservo serve` (POST /invocations, and TF Serving's :predict and V2's REST and gRPC
infer for TF Serving bodies), `tfservo invoke`, `tfservo transform` on the local engine and on
Beam, the Beam `BundleModelHandler` with content_type=, and the Ray Data (`BundlePredictor`)
and Spark (`bundle_predict_frames`) adapters' batch step with a `body` column (their clusters
are tested in tests/batch). Groups: SageMaker's multi-model archive with
SAGEMAKER_TFS_DEFAULT_MODEL_NAME naming its second model (each mode once read that variable
its own way), a bundle with an inference.py, and an inference pipeline given as a pipeline file.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from conftest import NEGATIVE_QUOTES_HANDLER as HANDLER
from conftest import SMC, write_code
from server_process import ServerProcess

from tfservo.batch.engines.beam import run_beam_transform
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.worker.failures import ElementErrors
from tfservo.beam import BundleModelHandler
from tfservo.cli import main as tfservo_cli
from tfservo.models.hooks import ModelHooks
from tfservo.service.invocation import error_result

MME = SMC / "resources" / "mme"
DEFAULT_ENV = {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_two"}
CSV, JSON, JSONLINES = "text/csv", "application/json", "application/jsonlines"


@dataclass(frozen=True)
class Case:
    id: str
    group: str  # "mme" or "handler"
    body: bytes
    content_type: str
    accept: str | None = None
    attributes: str | None = None

    @property
    def job_key(self) -> tuple[str, str, str | None, str | None]:
        return (self.group, self.content_type, self.accept, self.attributes)


CASES = [
    Case("csv, default model from the variable", "mme", b"1.0\n2.0\n5.0\n", CSV),
    Case("tf serving json", "mme", b'{"instances": [1.0, 2.0, 5.0]}', JSON),
    Case("tf serving columnar json", "mme", b'{"inputs": [[1.0], [2.0]]}', JSON),
    Case("generic json", "mme", b"[1.5, 2.5]", JSON),
    Case("json lines", "mme", b"[1.0]\n[2.0]\n", JSONLINES),
    Case("accept csv", "mme", b"1.0\n2.0\n", CSV, accept=CSV),
    Case("accept json lines", "mme", b"1.0\n2.0\n", CSV, accept=JSONLINES),
    Case("model and version by attribute", "mme", b"1.0\n2.0\n", CSV,
         attributes="tfs-model-name=half_plus_three,tfs-model-version=123"),
    Case("regress by attribute", "mme",
         b'{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}', JSON,
         attributes="tfs-model-name=half_plus_three,tfs-method=regress"),
    Case("bad record", "mme", b"1.0\nabc\n", CSV),
    Case("ragged rows", "mme", b"1.0\n2.0\n1.0,7.5\n", CSV),  # a row with an extra column: refused whole
    Case("bad json", "mme", b'{"instances": [1.0, }', JSON),
    Case("through inference.py", "handler", b"1 2 5", CSV),
    Case("inference.py raises", "handler", b"1 -2", CSV),
    Case("through a pipeline", "pipeline", b"1 2 5", CSV),
    Case("a pipeline's first container fails", "pipeline", b"1 x", CSV),
]
TFS_BODIES = {"tf serving json", "tf serving columnar json"}


def answer(status: int, body: bytes) -> tuple[int, bytes | str]:
    """(status, body) for a success; (status, error message) for an error."""
    if 200 <= status < 300:
        return status, body
    return status, orjson.loads(body)["error"]


def failure_answer(message: str) -> tuple[int, str]:
    """An error reported as '... answered STATUS: MESSAGE' (transform reports, Beam errors)."""
    found = re.search(r"answered (\d{3}): (.*)", message, re.S)
    assert found, message
    return int(found[1]), found[2]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parity")
    handler = root / "handler" / "half_plus_three"
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000124", handler / "00000124")
    write_code(handler / "code", HANDLER)
    # an inference pipeline in a pipeline file: a code-only conversion container, then the model
    write_code(root / "pipeline" / "to_json" / "code", CSV_TO_JSON)
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000124",
                    root / "pipeline" / "model" / "half_plus_three" / "00000124")
    pipeline = root / "pipeline" / "pipeline.toml"
    pipeline.write_text('[[containers]]\nmodel = "to_json"\n[[containers]]\nmodel = "model"\n')
    return {"mme": MME, "handler": handler, "pipeline": pipeline}


ENVS = {"mme": DEFAULT_ENV, "handler": {}, "pipeline": {}}
CSV_TO_JSON = """
    import json

    def handler(data, context):
        return json.dumps({"instances": [float(v) for v in data.read().decode().split()]}), "application/json"
"""


@pytest.fixture(scope="module")
def servers(bundles) -> Iterator[dict[str, ServerProcess]]:
    started = {group: ServerProcess([str(path)], env=ENVS[group]).start() for group, path in bundles.items()}
    yield started
    for server in started.values():
        server.stop()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def case_headers(case: Case) -> dict[str, str]:
    """The headers a SageMaker client sends with the case to /invocations."""
    headers = {"Content-Type": case.content_type}
    if case.accept:
        headers["Accept"] = case.accept
    if case.attributes:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = case.attributes
    return headers


def by_serve(servers, bundles, cases: list[Case]) -> dict[str, tuple]:
    out = {}
    for case in cases:
        with servers[case.group].client() as client:
            r = client.post("/invocations", content=case.body, headers=case_headers(case))
        out[case.id] = answer(r.status_code, r.content)
    return out


def by_invoke(servers, bundles, cases: list[Case]) -> dict[str, tuple]:
    out = {}
    runner = CliRunner()
    for case in cases:
        args = ["invoke", str(bundles[case.group]), "--content-type", case.content_type]
        if case.accept:
            args += ["--accept", case.accept]
        if case.attributes:
            args += ["--custom-attributes", case.attributes]
        result = runner.invoke(tfservo_cli, args, input=case.body, env=ENVS[case.group])
        if result.exit_code == 0:
            out[case.id] = (200, result.stdout_bytes)
        else:
            status = int(re.search(r"status (\d{3})", result.stderr)[1])
            out[case.id] = answer(status, result.stdout_bytes)
    return out


def _by_transform(run, bundles, cases: list[Case], tmp: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    jobs: dict[tuple, list[Case]] = {}
    for case in cases:
        jobs.setdefault(case.job_key, []).append(case)
    for n, ((group, content_type, accept, attributes), members) in enumerate(jobs.items()):
        source, target = tmp / f"in{n}", tmp / f"out{n}"
        source.mkdir(parents=True)
        names = {f"case{i}.dat": case for i, case in enumerate(members)}
        for name, case in names.items():
            (source / name).write_bytes(case.body)
        job = TransformJob(
            str(bundles[group]), str(source), str(target), content_type=content_type, accept=accept,
            custom_attributes=attributes, env=ENVS[group],
        )
        with environment({}):  # --env is applied to this process: put it back after
            summary = run(job)
        failures = {o.obj.rel: o.failure for o in summary.failed}
        for name, case in names.items():
            if name in failures:
                out[case.id] = failure_answer(failures[name].error)
            else:
                out[case.id] = (200, (target / f"{name}.out").read_bytes())
    return out


def by_local_transform(servers, bundles, cases, tmp_path) -> dict[str, tuple]:
    return _by_transform(lambda job: run_transform(job, progress="none"), bundles, cases, tmp_path / "local")


def by_beam_transform(servers, bundles, cases, tmp_path) -> dict[str, tuple]:
    return _by_transform(lambda job: run_beam_transform(job, progress="none"), bundles, cases, tmp_path / "beam")


def by_beam_handler(servers, bundles, cases: list[Case]) -> dict[str, tuple]:
    out = {}
    for (group, content_type, accept, attributes), members in _grouped(cases).items():
        handler = BundleModelHandler(
            str(bundles[group]), content_type=content_type, accept=accept, custom_attributes=attributes,
            env_vars=ENVS[group],
        )
        with environment({}):
            handler.set_environment_vars()
            model = handler.load_model()
        try:
            bodies = [case.body for case in members]
            try:
                results = list(handler.run_inference(bodies, model))
                by_body = {id(r.example): r.inference for r in results}
                for case, body in zip(members, bodies):
                    out[case.id] = (200, by_body[id(body)])
            except ElementErrors as errors:
                failed = {f.index: f.error for f in errors.failures}
                good = [case for i, case in enumerate(members) if i not in failed]
                for i, error in failed.items():
                    # in-process, the invocation path's own ServingError (not one rebuilt from an
                    # HTTP answer): its type gives the status every HTTP door answers
                    out[members[i].id] = (error_result(error).status, error.message)
                if good:  # the rest of the batch, without the failing ones
                    for r in handler.run_inference([c.body for c in good], model):
                        out[next(c.id for c in good if c.body is r.example)] = (200, r.inference)
        finally:
            model.close()
    return out


def _by_columns(make, bundles, cases: list[Case]) -> dict[str, tuple]:
    """A columnar adapter's batch step (`make(bundle, **selection)` → batch → columns) on each
    group's bodies as a `body` column; failed rows as the typed errors ElementErrors names."""
    out: dict[str, tuple] = {}
    for (group, content_type, accept, attributes), members in _grouped(cases).items():
        with environment(ENVS[group]):
            predict = make(str(bundles[group]), content_type=content_type, accept=accept,
                           custom_attributes=attributes)
            todo = list(members)
            while todo:
                try:
                    columns = predict({"body": np.array([c.body for c in todo], dtype=object)})
                except ElementErrors as errors:
                    failed = {f.index: f.error for f in errors.failures}
                    for i, error in failed.items():
                        out[todo[i].id] = (error_result(error).status, error.message)
                    todo = [case for i, case in enumerate(todo) if i not in failed]  # the rest again
                    continue
                for case, response in zip(todo, columns["response"]):
                    out[case.id] = (200, bytes(response))
                todo = []
    return out


def by_ray_adapter(servers, bundles, cases: list[Case]) -> dict[str, tuple]:
    from tfservo.ray import BundlePredictor

    return _by_columns(BundlePredictor, bundles, cases)


def by_spark_adapter(servers, bundles, cases: list[Case]) -> dict[str, tuple]:
    import pandas as pd

    from tfservo.spark import bundle_predict_frames

    def make(bundle: str, **selection):
        frames = bundle_predict_frames(bundle, **selection)

        def predict(batch):
            (frame,) = list(frames(iter([pd.DataFrame(batch)])))
            return {name: frame[name].to_numpy() for name in frame.columns}

        return predict

    return _by_columns(make, bundles, cases)


def _grouped(cases: list[Case]) -> dict[tuple, list[Case]]:
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.job_key, []).append(case)
    return groups


@pytest.fixture(scope="module")
def reference(servers, bundles) -> dict[str, tuple]:
    return by_serve(servers, bundles, CASES)


def test_the_reference_answers_are_the_expected_ones(reference) -> None:
    """What serve answers, checked against the models' arithmetic, so the table cannot agree on nonsense."""
    assert orjson.loads(reference["csv, default model from the variable"][1]) == {"predictions": [2.5, 3.0, 4.5]}
    assert orjson.loads(reference["model and version by attribute"][1]) == {"predictions": [3.5, 4.0]}
    assert reference["accept csv"] == (200, b"2.5\n3.0\n")
    assert orjson.loads(reference["regress by attribute"][1]) == {"results": [3.5, 4.0]}
    assert reference["through inference.py"] == (200, b"3.50\n4.00\n5.50")
    assert reference["bad record"][0] == 400 and "abc" in reference["bad record"][1]
    assert reference["ragged rows"][0] == 400 and "same shape" in reference["ragged rows"][1]
    assert reference["inference.py raises"] == (500, "negative values are not quotes: -2.0")
    assert orjson.loads(reference["through a pipeline"][1]) == {"predictions": [3.5, 4.0, 5.5]}
    assert reference["a pipeline's first container fails"] == (500, "could not convert string to float: 'x'")


@pytest.mark.parametrize(
    "mode",
    [by_invoke, by_local_transform, by_beam_transform, by_beam_handler, by_ray_adapter, by_spark_adapter],
    ids=lambda m: m.__name__[3:],
)
def test_every_mode_answers_as_serve(mode, servers, bundles, reference, tmp_path) -> None:
    args = (servers, bundles, CASES) + ((tmp_path,) if "transform" in mode.__name__ else ())
    got = mode(*args)
    if mode is by_invoke:  # it ends what it prints with a newline, for terminals
        reference = {k: (s, b if not isinstance(b, bytes) or b.endswith(b"\n") else b + b"\n") for k, (s, b) in reference.items()}
    mismatched = {case: (got.get(case), want) for case, want in reference.items() if got.get(case) != want}
    assert not mismatched, mismatched


def test_tf_serving_rest_answers_as_invocations(servers, reference) -> None:
    with servers["mme"].client() as client:
        for case in CASES:
            if case.id in TFS_BODIES:
                r = client.post("/v1/models/half_plus_two:predict", content=case.body)
                assert answer(r.status_code, r.content) == reference[case.id], case.id


def test_v2_rest_and_grpc_answer_as_invocations(servers, reference) -> None:
    """The TF Serving bodies' instances as V2 tensors, over REST (JSON) and gRPC (tritonclient):
    the same numbers as /invocations answered."""
    import tritonclient.grpc as grpcclient

    want = orjson.loads(reference["tf serving json"][1])["predictions"]
    x = np.array([1.0, 2.0, 5.0], dtype=np.float32)
    server = servers["mme"]
    with server.client() as client:
        r = client.post("/v2/models/half_plus_two/infer", json={
            "inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": x.tolist()}]})
        assert r.status_code == 200, r.text
        (output,) = r.json()["outputs"]
        assert output["data"] == want
    triton = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        tensor = grpcclient.InferInput("x", [3], "FP32")
        tensor.set_data_from_numpy(x)
        result = triton.infer("half_plus_two", [tensor])
        assert result.as_numpy(output["name"]).tolist() == want
    finally:
        triton.close()


def test_several_bodies_go_to_the_model_as_one_call_and_answer_as_if_alone(bundles) -> None:
    """Invoker.call_many (Beam's content_type= batches): one model call for CSV bodies, each
    body's answer byte-identical to its lone invocation, and a bad body failing alone."""
    from tfservo.core.settings import resolve_settings
    from tfservo.models.batching import BatchingOptions
    from tfservo.service.factory import build_service

    batches: list[int] = []
    settings = resolve_settings(paths=[str(MME)], multi_model=False, env=DEFAULT_ENV).replace(
        batching=BatchingOptions(max_batch_size=64, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=8)
    )
    service = build_service(settings, hooks=ModelHooks(
        on_batch=lambda model, rows, padded, seconds, queued: batches.append(rows)))
    try:
        bodies = [b"1.0\n2.0\n", b"5.0\n", b"3.0\n4.0\n6.0\n"]
        for accept in (None, CSV, JSONLINES):
            batches.clear()
            together = [r.encoded() for r in service.invoker.call_many(bodies, CSV, accept)]
            assert batches == [6], batches  # one call of all six instances
            alone = [service.invoker.invoke(body, CSV, accept) for body in bodies]
            assert [(r.status, r.body) for r in together] == [(r.status, r.body) for r in alone]
        mixed = service.invoker.call_many([b"1.0\n", b"oops\n", b"2.0\n"], CSV)
        assert [r.status for r in mixed] == [200, 400, 200]
        assert mixed[1].encoded().body == service.invoker.invoke(b"oops\n", CSV).body
    finally:
        service.close()
