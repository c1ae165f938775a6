"""`transform --runner ray` on a real Ray cluster with two raylets (one CPU each): the local
engine's .out bytes, failures and dead letters for CSV with filters and join, JSON lines, one
large object split across workers and images through a b64 handler; a killed run resumes to
identical bytes; and the Ray Data adapter on a keyed dataset."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from clusters import image_example, ray_cluster
from transform_jobs import HALF_PLUS_THREE, INSURANCE, counts, hp3, insurance_input, report, tree, write  # noqa: F401

from tfservo.batch.engines.ray import RaySettings, actor_shape, run_ray_transform
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.loading import load_service


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster() as address:
        yield address


def both(service, model: Path, source: Path, tmp_path: Path, settings: RaySettings | None = None, **flags):
    """The job by the local engine into tmp/local and on Ray into tmp/ray; checks they agree."""
    local = run_transform(TransformJob(str(model), str(source), str(tmp_path / "local"), **flags),
                          service=service, progress="none")
    on_ray = run_ray_transform(TransformJob(str(model), str(source), str(tmp_path / "ray"), **flags), settings,
                               progress="none")
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert report(tmp_path / "ray") == report(tmp_path / "local")
    assert counts(on_ray) == counts(local)
    return local, on_ray


def test_csv_with_filters_join_as_whole_objects_and_one_large_object_across_both_workers(cluster, hp3, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    source = insurance_input(tmp_path / "in")
    _, on_ray = both(hp3, HALF_PLUS_THREE, source, tmp_path, **INSURANCE, max_payload_mb=0.0005)  # quotes: ~40 requests
    assert (on_ray.done, len(on_ray.failed), on_ray.records) == (3, 1, 304)
    assert len(on_ray.workers) == 2, on_ray.workers  # both raylets' actors took objects
    assert "on 2 workers" in on_ray.line()
    assert "running 4 objects on Ray (whole objects on each actor)" in caplog.text  # two objects an actor or more
    assert "2 model workers on Ray, 1 CPU each" in caplog.text

    _, alone = both(hp3, HALF_PLUS_THREE, source / "2024", tmp_path / "alone", **INSURANCE, max_payload_mb=0.0005)
    assert (alone.done, alone.records) == (1, 300) and len(alone.workers) == 2, alone.workers
    assert "running 1 objects on Ray (each object's requests spread over the actors)" in caplog.text


def test_json_lines_with_skipped_records_and_dead_letters_on_more_workers_than_cpus(cluster, hp3, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    rows = [{"id": f"r{i}", "features": float(i)} for i in range(40)]
    rows[7]["features"] = "seven"
    write(tmp_path / "in" / "data.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    # --workers 3 on two 1-CPU raylets: three actors of half a CPU (whole CPUs, one would never start)
    _, on_ray = both(hp3, HALF_PLUS_THREE, tmp_path / "in", tmp_path, RaySettings(workers=3), split_type="Line",
                     assemble_with="Line", input_filter="$.features", join_source="Input", on_record_error="skip",
                     max_payload_mb=0.0002)
    assert on_ray.ok and [(o.obj.rel, o.dead_letters) for o in on_ray.dead_lettered] == [("data.jsonl", 1)]
    assert "3 model workers on Ray, 0.5 CPUs each" in caplog.text


@pytest.mark.parametrize(("nodes", "workers", "shape"), [
    ([1, 1], 0, (2, 1.0)),  # the default: an actor per CPU
    ([8, 8], 2, (2, 8.0)),  # --workers N shares the CPUs out
    ([8, 8], 3, (3, 4.0)),  # in shares every actor's node can hold: 5 CPUs would leave one waiting
    ([3, 1], 2, (2, 1.0)),
    ([1, 1], 3, (3, 0.5)),  # more actors than CPUs: fractions of one
    ([2], 5, (5, 1 / 3)),
])
def test_actors_share_out_the_cluster_cpus_in_shares_its_nodes_can_hold(nodes, workers, shape):
    assert actor_shape(nodes, workers) == shape


def test_a_cluster_without_cpus_is_an_error_not_a_wait():
    with pytest.raises(JobError, match="no node with a whole CPU"):
        actor_shape([0, 0.5], 2)


def test_images_through_a_b64_handler_on_each_worker(cluster, tmp_path):
    example = image_example()
    model = Path(example.build_model(str(tmp_path / "model")))
    example.write_images(str(tmp_path / "images"))
    service = load_service(str(model))
    try:
        both(service, model, tmp_path / "images", tmp_path, content_type="application/x-image")
    finally:
        service.close()
    assert list((tmp_path / "ray").rglob("*.out"))


def test_a_killed_run_resumes_to_identical_bytes(cluster, hp3, tmp_path):
    for i in range(60):
        write(tmp_path / "in" / f"part-{i:03d}.csv", "".join(f"k{i}-{j},{j}.5\n" for j in range(50)))
    flags = ["--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line",
             "--input-filter", "$[1:]", "--join-source", "Input"]
    command = [str(Path(sys.executable).with_name("tfservo")), "transform", str(HALF_PLUS_THREE), str(tmp_path / "in"),
               str(tmp_path / "ray"), *flags, "--runner", "ray", "--ray-address", cluster, "--max-payload", "0.0002"]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    while not list((tmp_path / "ray").glob("*.out")) and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its actors' owner, mid-run
    driver.wait()
    written = len(list((tmp_path / "ray").glob("*.out")))
    assert 0 < written < 60, f"{written} objects were written before the kill; the test needs a run cut short"
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "already done" in resumed.stderr
    run_transform(TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "local"), content_type="text/csv",
                               split_type="Line", assemble_with="Line", input_filter="$[1:]", join_source="Input",
                               max_payload_mb=0.0002), service=hp3, progress="none")
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")


def test_ray_data_adapter_keeps_keys_and_reports_bad_rows(cluster):
    import ray

    from tfservo.ray import BundlePredictor

    rows = [{"id": f"k{i}", "x": float(i)} for i in range(40)]
    ds = ray.data.from_items(rows).map_batches(
        BundlePredictor, fn_constructor_args=(str(HALF_PLUS_THREE),), compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=8, batch_format="numpy",
    )
    got = sorted(ds.take_all(), key=lambda r: int(r["id"][1:]))
    assert [(r["id"], float(r["y"])) for r in got] == [(f"k{i}", i / 2 + 3) for i in range(40)]

    bodies = [{"id": "a", "body": b"1.0"}, {"id": "b", "body": b"oops"}, {"id": "c", "body": b"3.0"}]
    ds = ray.data.from_items(bodies).map_batches(
        BundlePredictor, fn_constructor_args=(str(HALF_PLUS_THREE),),
        fn_constructor_kwargs={"content_type": "text/csv", "on_error": "column"},
        compute=ray.data.ActorPoolStrategy(size=1), batch_size=3, batch_format="numpy",
    )
    by_id = {r["id"]: r for r in ds.take_all()}
    assert json.loads(by_id["a"]["response"]) == {"predictions": [3.5]} and by_id["a"]["error"] is None
    assert by_id["b"]["response"] is None and "oops" in by_id["b"]["error"]
    assert np.isclose(json.loads(by_id["c"]["response"])["predictions"][0], 4.5)


def test_s3_in_and_out_with_the_workers_environment_from_env_flags(cluster, tmp_path, s3_endpoint, s3_bucket):
    """Workers started before the job get the S3 settings through the job's --env (as on a real
    cluster, whose nodes do not share the driver's environment)."""
    from s3_server import s3_client, upload_dir

    write(tmp_path / "in" / "q1.csv", "a,1\nb,2\n")
    write(tmp_path / "in" / "deep" / "q2.csv", "c,3\n")
    upload_dir(s3_endpoint, s3_bucket, "jobs/in", tmp_path / "in")
    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                                      "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION") if k in os.environ}
    summary = run_ray_transform(TransformJob(str(HALF_PLUS_THREE), f"s3://{s3_bucket}/jobs/in/",
                                             f"s3://{s3_bucket}/jobs/out/", env=env, **INSURANCE), progress="none")
    assert summary.done == 2 and summary.ok
    client = s3_client(s3_endpoint)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="jobs/out/")["Contents"])
    assert keys == ["jobs/out/deep/q2.csv.out", "jobs/out/q1.csv.out"]
    assert client.get_object(Bucket=s3_bucket, Key="jobs/out/q1.csv.out")["Body"].read() == b"a,3.5\nb,4.0\n"


def test_data_capture_on_ray_matches_the_local_engines(cluster, hp3, tmp_path):
    """The same capture lines (event ids and times aside), one file per object, from Ray's workers."""
    source = insurance_input(tmp_path / "in")
    capture = {"local": tmp_path / "capture-local", "ray": tmp_path / "capture-ray"}
    flags = {**INSURANCE, "max_payload_mb": 0.0005, "generate_inference_id": True}
    run_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "local"), **flags,
                               data_capture=str(capture["local"])), service=hp3, progress="none")
    run_ray_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "ray"), **flags,
                                   data_capture=str(capture["ray"])), RaySettings(), progress="none")

    def lines(root: Path) -> dict[str, list]:
        found = {}
        for path in sorted(root.rglob("*.jsonl")):
            docs = [json.loads(line) for line in path.read_text().splitlines()]
            found[path.name] = [(d["captureData"], d["eventMetadata"]["inferenceId"]) for d in docs]
        return found

    local, on_ray = lines(capture["local"]), lines(capture["ray"])
    assert on_ray == local and len(local) == 3  # the object that failed has none
    assert len(local["quotes.csv.jsonl"]) >= 2  # its requests from both workers, in order


def test_follow_on_ray_transforms_objects_as_they_land_with_its_actors_kept(cluster, hp3, tmp_path, caplog):
    """`transform --follow --runner ray`: each poll's new objects run on the same model actors,
    and the outputs are the local engine's."""
    import threading

    from tfservo.batch.engines.follow import follow_transform
    from tfservo.batch.engines.ray import RayPasses

    flags = {"content_type": "text/csv", "split_type": "Line", "assemble_with": "Line"}
    inputs, out = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.csv", "1.0\n2.0\n")
    stop, result = threading.Event(), {}
    job = TransformJob(str(HALF_PLUS_THREE), str(inputs), str(out), **flags)
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    follower = threading.Thread(target=lambda: result.setdefault("summary", follow_transform(
        job, stop, poll_seconds=0.3, passes=lambda j: RayPasses(j, RaySettings()))))
    follower.start()
    try:
        deadline = time.monotonic() + 180
        for name, text in (("b.csv", "3.0\n"), ("sub/c.csv", "4.0\n5.0\n6.0\n")):
            while not (out / "a.csv.out").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            write(inputs / name, text)  # lands after the first pass
        while not (out / "sub" / "c.csv.out").exists() or not (out / "b.csv.out").exists():
            assert time.monotonic() < deadline and follower.is_alive(), "the later objects were not transformed"
            time.sleep(0.1)
    finally:
        stop.set()
        follower.join(120)
    summary = result["summary"]
    assert (summary.done, summary.records, summary.failed) == (3, 6, []) and summary.workers
    starts = [r for r in caplog.records if "model workers on Ray" in r.getMessage()]
    assert len(starts) == 1, [r.getMessage() for r in starts]  # one set of actors for every pass
    run_transform(TransformJob(str(HALF_PLUS_THREE), str(inputs), str(tmp_path / "local"), **flags),
                  service=hp3, progress="none")
    assert tree(out) == tree(tmp_path / "local")


def test_a_keras_file_on_ray_as_a_transform_and_through_the_data_adapter(cluster, tmp_path):
    """A Keras 3 `.keras` version dir: the transform's .out bytes equal the local engine's, and
    the Ray Data adapter answers what Keras's own predict does."""
    import ray
    from keras_models import build_keras_models

    from tfservo.ray import BundlePredictor

    k = build_keras_models(tmp_path / "keras")
    mlp = k.dir("mlp")
    flags = k.mlp_csv_input(tmp_path / "in")
    _, on_ray = both(load_service(str(mlp)), mlp, tmp_path / "in", tmp_path, **flags)
    assert on_ray.ok and on_ray.records == len(k.mlp_x)
    lines = (tmp_path / "ray" / "rows.csv.out").read_text().splitlines()
    np.testing.assert_allclose([json.loads(line) for line in lines], k.mlp_y, rtol=1e-5, atol=1e-6)

    rows = [{"id": f"k{i}", "x": x} for i, x in enumerate(k.mlp_x)]
    ds = ray.data.from_items(rows).map_batches(
        BundlePredictor, fn_constructor_args=(str(mlp),), compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=1, batch_format="numpy",
    )
    got = sorted(ds.take_all(), key=lambda r: int(r["id"][1:]))
    np.testing.assert_allclose(np.stack([r["output_0"] for r in got]), k.mlp_y, rtol=1e-5, atol=1e-6)
