"""`transform --runner spark` on a real Spark standalone cluster (a master and two one-core
workers from the pyspark package's bin/spark-class, Debian's Java 17): the local engine's .out
bytes for CSV with filters and join, one large object split across workers and images through
a b64 handler; and the pandas UDF and mapInPandas adapters on a keyed DataFrame."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from clusters import image_example, spark_standalone
from transform_jobs import HALF_PLUS_THREE, INSURANCE, counts, hp3, insurance_input, report, tree, write  # noqa: F401

from tfservo.batch.engines.run import run_transform
from tfservo.batch.engines.spark import SparkSettings, run_spark_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import load_service


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One application on the standalone cluster for the module: its executors (and their
    Python workers, with the models loaded) serve every test."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with spark_standalone(tmp_path_factory.mktemp("spark")) as master:
        builder = (SparkSession.builder.master(master).appName("tfservo tests").config("spark.ui.enabled", "false")
                   .config("spark.executor.memory", "1g").config("spark.python.worker.reuse", "true"))
        for attempt in range(3):
            # Seen once in a full run (a Ray module had run in this worker, the other worker busy):
            # the driver's JVM gateway exited at start without a word; the next try starts it.
            try:
                session = builder.getOrCreate()
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(5)
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()


def both(service, model: Path, source: Path, tmp_path: Path, **flags):
    """The job by the local engine into tmp/local and on Spark into tmp/spark; checks they agree."""
    local = run_transform(TransformJob(str(model), str(source), str(tmp_path / "local"), **flags),
                          service=service, progress="none")
    on_spark = run_spark_transform(TransformJob(str(model), str(source), str(tmp_path / "spark"), **flags),
                                   SparkSettings(), progress="none")
    assert tree(tmp_path / "spark") == tree(tmp_path / "local")
    assert report(tmp_path / "spark") == report(tmp_path / "local")
    assert counts(on_spark) == counts(local)
    return local, on_spark


def test_csv_with_filters_join_as_whole_objects_in_both_executors(spark, hp3, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    source = insurance_input(tmp_path / "in")
    _, on_spark = both(hp3, HALF_PLUS_THREE, source, tmp_path, **INSURANCE, max_payload_mb=0.0005)
    assert (on_spark.done, len(on_spark.failed), on_spark.records) == (3, 1, 304)
    assert len(on_spark.workers) >= 2, on_spark.workers  # Python workers of both executors answered
    assert "whole objects in each task" in caplog.text  # four objects, two workers


def test_big_json_lines_object_with_dead_letters(spark, hp3, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    write(tmp_path / "in" / "big.jsonl", "".join(f'{{"id": "r{i}", "x": {i}.5}}\n' if i != 17 else '{"id": "r17", "x": "?"}\n'
                                                for i in range(2000)))
    _, on_spark = both(hp3, HALF_PLUS_THREE, tmp_path / "in", tmp_path, split_type="Line", assemble_with="Line",
                       input_filter="$.x", join_source="Input", on_record_error="skip", max_payload_mb=0.002)
    assert on_spark.ok and on_spark.records == 2000 and on_spark.dead_lettered[0].dead_letters == 1
    assert "each object's requests spread over the workers" in caplog.text


def test_images_through_a_b64_handler(spark, tmp_path):
    example = image_example()
    model = Path(example.build_model(str(tmp_path / "model")))
    example.write_images(str(tmp_path / "images"))
    service = load_service(str(model))
    try:
        both(service, model, tmp_path / "images", tmp_path, content_type="application/x-image")
    finally:
        service.close()


def test_pandas_udf_and_map_in_pandas_keep_keys_and_report_bad_rows(spark):
    from tfservo.spark import bundle_predict_frames, bundle_predict_udf

    df = spark.createDataFrame([(f"k{i}", float(i)) for i in range(30)], "id string, x float")
    y = bundle_predict_udf(str(HALF_PLUS_THREE), return_type="float")
    got = {r["id"]: r["y"] for r in df.repartition(2).withColumn("y", y("x")).collect()}
    assert got == {f"k{i}": pytest.approx(i / 2 + 3) for i in range(30)}

    frames = bundle_predict_frames(str(HALF_PLUS_THREE), content_type="text/csv", on_error="column")
    bodies = spark.createDataFrame([("a", b"1.0"), ("b", b"oops"), ("c", b"3.0")], "id string, body binary")
    rows = {r["id"]: r for r in bodies.mapInPandas(frames, "id string, response binary, error string").collect()}
    assert json.loads(bytes(rows["a"]["response"])) == {"predictions": [3.5]} and rows["a"]["error"] is None
    assert rows["b"]["response"] is None and "oops" in rows["b"]["error"]


def test_structured_streaming_answers_each_row_once_across_a_stop_and_a_restart_from_its_checkpoint(spark, tmp_path):
    """A file-source streaming query through the pandas UDF and mapInPandas: stopped after its first
    micro-batches, more files land, restarted from its checkpoint; every input row has exactly one
    output row, with the model's answer."""
    from tfservo.spark import bundle_predict_frames, bundle_predict_udf

    source, sink, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()

    def land(name: str, first: int, count: int) -> None:
        rows = "".join(f"r{i},{i}.0\n" for i in range(first, first + count))
        (source / f".{name}").write_text(rows)
        (source / f".{name}").rename(source / name)  # a file source must only see whole files

    y = bundle_predict_udf(str(HALF_PLUS_THREE), return_type="float")

    def query(trigger: dict):
        stream = spark.readStream.schema("id string, x float").option("maxFilesPerTrigger", 1).csv(str(source))
        return (stream.withColumn("y", y("x")).writeStream.format("parquet").option("path", str(sink))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    land("a.csv", 0, 40)
    land("b.csv", 40, 40)
    running = query({"processingTime": "1 second"})
    try:
        deadline = time.monotonic() + 240
        while not (running.lastProgress and running.lastProgress.get("numInputRows", 0) > 0):
            assert running.exception() is None and time.monotonic() < deadline, running.exception()
            time.sleep(0.5)
    finally:
        running.stop()  # stopped after at least one micro-batch, perhaps mid-way through the files
    land("c.csv", 80, 40)
    again = query({"availableNow": True})
    again.awaitTermination(300)
    assert again.exception() is None
    rows = spark.read.parquet(str(sink)).collect()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == 120  # every row once: none lost, none twice
    assert all(r["y"] == pytest.approx(r["x"] / 2 + 3) for r in rows)

    # mapInPandas on the same stream: the signature's input columns go in, its outputs come out beside the keys
    frames = bundle_predict_frames(str(HALF_PLUS_THREE))
    stream = spark.readStream.schema("id string, x float").csv(str(source))
    mapped = (stream.mapInPandas(frames, "id string, y float").writeStream.format("parquet")
              .option("path", str(tmp_path / "out2")).option("checkpointLocation", str(tmp_path / "checkpoint2"))
              .trigger(availableNow=True).start())
    mapped.awaitTermination(300)
    assert mapped.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out2")).collect()
    assert sorted(r["id"] for r in rows) == sorted(f"r{i}" for i in range(120))
    assert all(r["y"] == pytest.approx(int(r["id"][1:]) / 2 + 3) for r in rows)


def test_a_keras_file_on_spark_as_a_transform_and_through_the_udf(spark, tmp_path):
    """A Keras 3 `.keras` version dir: the transform's .out bytes equal the local engine's, and a
    pandas UDF over its two named inputs answers what Keras's own predict does."""
    import numpy as np
    from keras_models import build_keras_models

    from tfservo.spark import bundle_predict_udf

    k = build_keras_models(tmp_path / "keras")
    mlp = k.dir("mlp")
    flags = k.mlp_csv_input(tmp_path / "in")
    _, on_spark = both(load_service(str(mlp)), mlp, tmp_path / "in", tmp_path, **flags)
    assert on_spark.ok and on_spark.records == len(k.mlp_x)

    age, income = k.pair_in["age"][0].tolist(), k.pair_in["income"][0].tolist()
    df = spark.createDataFrame([("p", age, income)], "id string, age array<float>, income array<float>")
    score = bundle_predict_udf(str(k.dir("pair")), return_type="array<float>", output="score",
                               input_names=["age", "income"])
    (row,) = df.withColumn("score", score("age", "income")).collect()
    np.testing.assert_allclose(row["score"], k.pair_out["score"][0], rtol=1e-5, atol=1e-6)
