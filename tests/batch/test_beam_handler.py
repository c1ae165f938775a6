"""BundleModelHandler in real Beam pipelines on the in-process DirectRunner.

Pipelines are slow to start, so each test runs one pipeline with several branches.
"""

from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import (
    KeyedModelHandler,
    KeyModelMapping,
    MaybeKeyedModelHandler,
    RunInference,
)
from apache_beam.testing.util import assert_that, equal_to
from beam_models import BeamModels, beam_models  # noqa: F401
from conftest import TFS
from s3_server import upload_dir

from tfservo.beam import BundleModelHandler, ElementErrors
from tfservo.core.errors import BundleError, InvalidArgument

HALF_PLUS_TWO = str(TFS / "saved_model_half_plus_two_2_versions")
HALF_PLUS_TWO_TF2 = str(TFS / "saved_model_half_plus_two_tf2_cpu")
MODEL = "saved_model_half_plus_two_2_versions"


def example(x: float) -> tf.train.Example:
    return tf.train.Example(
        features=tf.train.Features(feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=[x]))})
    )


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_predict_classify_regress_keys_and_batching(beam_models: BeamModels) -> None:
    p = beam.Pipeline()
    xs = [1.0, 2.0, 5.0, 6.0, 9.0]

    # Arrays, unkeyed, latest version, batches of at most 2.
    predicted = (
        p
        | "A Create" >> beam.Create([f32(x) for x in xs])
        | "A Predict" >> RunInference(BundleModelHandler(HALF_PLUS_TWO, min_batch_size=2, max_batch_size=2))
        | "A Out" >> beam.Map(lambda r: (float(r.example[0]), float(r.inference["y"][0]), r.model_id))
    )
    assert_that(predicted, equal_to([(x, 0.5 * x + 2, f"{MODEL}/124") for x in xs]), label="A")

    # Keyed, version pinned.
    keyed = (
        p
        | "B Create" >> beam.Create([("k1", f32(4.0)), ("k2", f32(8.0))])
        | "B Predict" >> RunInference(KeyedModelHandler(BundleModelHandler(HALF_PLUS_TWO, version=123)))
        | "B Out" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"][0]), r.model_id))
    )
    assert_that(keyed, equal_to([("k1", 4.0, f"{MODEL}/123"), ("k2", 6.0, f"{MODEL}/123")]), label="B")

    # MaybeKeyedModelHandler, unkeyed input, a TF2 SavedModel, scalar-per-row elements.
    maybe = (
        p
        | "C Create" >> beam.Create([f32(3.0), f32(7.0)])
        | "C Predict" >> RunInference(MaybeKeyedModelHandler(BundleModelHandler(HALF_PLUS_TWO_TF2)))
        | "C Out" >> beam.Map(lambda r: float(r.inference["y"][0]))
    )
    assert_that(maybe, equal_to([3.5, 5.5]), label="C")

    # tf.train.Example in, regress_log out (method taken from the signature).
    regress_logs = (
        p
        | "D Create" >> beam.Create([example(4.0), example(10.0)])
        | "D Regress"
        >> RunInference(
            BundleModelHandler(HALF_PLUS_TWO, signature_name="regress_x_to_y", output="prediction_log")
        )
        | "D Out"
        >> beam.Map(
            lambda log: (
                log.WhichOneof("log_type"),
                log.regress_log.request.input.example_list.examples[0]
                .features.feature["x"]
                .float_list.value[0],
                log.regress_log.response.result.regressions[0].value,
                log.regress_log.response.model_spec.signature_name,
                log.regress_log.response.model_spec.version.value,
            )
        )
    )
    assert_that(
        regress_logs,
        equal_to(
            [
                ("regress_log", 4.0, 4.0, "regress_x_to_y", 124),
                ("regress_log", 10.0, 7.0, "regress_x_to_y", 124),
            ]
        ),
        label="D",
    )

    # Serialized Examples in, classify results (no classes output: label "").
    classified = (
        p
        | "E Create" >> beam.Create([example(1.0).SerializeToString(), example(3.0).SerializeToString()])
        | "E Classify" >> RunInference(BundleModelHandler(HALF_PLUS_TWO, signature_name="classify_x_to_y"))
        | "E Out" >> beam.Map(lambda r: r.inference)
    )
    assert_that(classified, equal_to([[("", 2.5)], [("", 3.5)]]), label="E")

    # Predict on a one-string-input signature with Examples: predict_log as tfx-bsl writes it.
    predict_logs = (
        p
        | "F Create" >> beam.Create([example(6.0)])
        | "F Predict"
        >> RunInference(
            BundleModelHandler(
                HALF_PLUS_TWO, signature_name="classify_x_to_y", method="predict", output="prediction_log"
            )
        )
        | "F Out"
        >> beam.Map(
            lambda log: (
                log.predict_log.request.inputs["inputs"].dtype,
                list(tf.make_ndarray(log.predict_log.request.inputs["inputs"]).shape),
                tf.train.Example.FromString(tf.make_ndarray(log.predict_log.request.inputs["inputs"])[0])
                .features.feature["x"]
                .float_list.value[0],
                tf.make_ndarray(log.predict_log.response.outputs["scores"]).tolist(),
            )
        )
    )
    assert_that(predict_logs, equal_to([(tf.string.as_datatype_enum, [1], 6.0, [[5.0]])]), label="F")

    # Dicts of arrays for a two-input signature; feature dicts for regress.
    dicts = (
        p
        | "G Create" >> beam.Create([{"a": [1.0, 2.0], "b": [3.0, 4.0]}, {"a": [0.5, 1.0], "b": [2.0, 2.0]}])
        | "G Predict" >> RunInference(BundleModelHandler(beam_models.two_inputs))
        | "G Out" >> beam.Map(lambda r: (r.inference["product"].tolist(), float(r.inference["total"])))
    )
    assert_that(dicts, equal_to([([3.0, 8.0], 10.0), ([1.0, 2.0], 5.5)]), label="G")
    features = (
        p
        | "H Create" >> beam.Create([{"x": 2.0}, {"x": 8}])
        | "H Regress" >> RunInference(BundleModelHandler(HALF_PLUS_TWO, signature_name="regress_x_to_y"))
        | "H Out" >> beam.Map(lambda r: r.inference)
    )
    assert_that(features, equal_to([3.0, 6.0]), label="H")

    result = p.run()
    result.wait_until_finish()
    metrics = result.metrics().query(MetricsFilter().with_namespace("tfservo"))
    sizes = [
        m for m in metrics["distributions"] if m.key.metric.name == "batch_size" and "A Predict" in m.key.step
    ]
    assert sizes and max(m.committed.max for m in sizes) == 2  # max_batch_size honoured
    assert sum(m.committed.sum for m in sizes) == len(xs)
    assert sum(m.committed.count for m in sizes) == 3  # 2 + 2 + 1: batches of 2 were formed
    inferences = sum(m.committed for m in metrics["counters"] if m.key.metric.name == "inferences")
    assert inferences == len(xs) + 2 + 2 + 2 + 2 + 1 + 2 + 2
    loads = [m for m in metrics["distributions"] if m.key.metric.name == "model_load_millis"]
    assert loads and all(m.committed.count >= 1 and m.committed.min >= 0 for m in loads)
    latency = [m for m in metrics["distributions"] if m.key.metric.name == "batch_latency_micros"]
    assert latency and all(m.committed.max > 0 for m in latency)


def test_several_models_in_sequence_per_key_and_inference_py(beam_models: BeamModels) -> None:
    p = beam.Pipeline()
    records = p | "Create" >> beam.Create([("a", 1.0), ("b", 2.0), ("c", 3.0)])

    # In sequence: ×5, post-process, ×10.
    chained = (
        records
        | "x5" >> RunInference(KeyedModelHandler(BundleModelHandler(beam_models.five)))
        | "next" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"])))
        | "x10" >> RunInference(KeyedModelHandler(BundleModelHandler(beam_models.ten)))
        | "seq out" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"]), r.model_id))
    )
    assert_that(
        chained,
        equal_to(
            [("a", 50.0, "multiply_ten/1"), ("b", 100.0, "multiply_ten/1"), ("c", 150.0, "multiply_ten/1")]
        ),
        label="sequence",
    )

    # Per key: a and c → ×5, b → ×10.
    mapping = KeyedModelHandler(
        [
            KeyModelMapping(["a", "c"], BundleModelHandler(beam_models.five)),
            KeyModelMapping(["b"], BundleModelHandler(beam_models.ten)),
        ]
    )
    routed = (
        records
        | "per key" >> RunInference(mapping)
        | "per key out" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"]), r.model_id))
    )
    assert_that(
        routed,
        equal_to(
            [("a", 5.0, "multiply_five/1"), ("b", 20.0, "multiply_ten/1"), ("c", 15.0, "multiply_five/1")]
        ),
        label="per key",
    )

    # Raw request bytes through content conversion + inference.py (which calls context.rest_uri).
    invoked = (
        p
        | "bodies" >> beam.Create([b"1\n2", "3"])
        | "invoke" >> RunInference(BundleModelHandler(beam_models.with_handler, content_type="text/csv"))
        | "invoke out" >> beam.Map(lambda r: (r.example, r.inference))
    )
    assert_that(invoked, equal_to([(b"1\n2", b"1->5\n2->10"), ("3", b"3->15")]), label="inference.py")

    # Raw bytes without inference.py: the container's CSV conversion and Accept handling.
    converted = (
        p
        | "csv" >> beam.Create([b"1.0\n2.0"])
        | "convert"
        >> RunInference(
            BundleModelHandler(HALF_PLUS_TWO, content_type="text/csv", accept="application/jsonlines")
        )
        | "convert out" >> beam.Map(lambda r: r.inference)
    )
    assert_that(converted, equal_to([b'{    "predictions": [2.5, 3.0    ]}']), label="conversion")
    p.run().wait_until_finish()


def test_only_bad_elements_of_a_batch_reach_the_dead_letter_output() -> None:
    p = beam.Pipeline()
    # A batch of 8 with one malformed element: 7 results, 1 dead letter holding that element.
    xs = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    elements: list = [f32(x) for x in xs]
    elements[3] = "abc"
    main, dlq = (
        p
        | "eight" >> beam.Create(elements)
        | "batch of 8"
        >> RunInference(
            BundleModelHandler(HALF_PLUS_TWO, min_batch_size=8, max_batch_size=8, per_element_failures=True)
        ).with_exception_handling()
    )
    good = main | "8 out" >> beam.Map(lambda r: (float(r.example[0]), float(r.inference["y"][0]), r.model_id))
    assert_that(good, equal_to([(x, 0.5 * x + 2, f"{MODEL}/124") for x in xs if x != 3.0]), label="7 results")
    failed = dlq.failed_inferences | "8 dlq" >> beam.MapTuple(
        lambda batch, error: (list(batch), error[0].__name__, error[1], "".join(error[2]))
    )

    def check_failure(items):
        assert len(items) == 1, items
        batch, kind, message, trace = items[0]
        assert (batch, kind) == (["abc"], "ElementErrors")
        assert "1 of 8 elements failed" in message
        assert "element 3 ('abc')" in message
        assert "expects DT_FLOAT values" in message
        assert f"model {MODEL} version 124 signature serving_default (predict)" in message
        assert "expects DT_FLOAT values" in trace.split("direct cause")[0]  # the element's own error first

    assert_that(failed, check_failure, label="1 failure")

    # Maybe-keyed (unkeyed here), pre-batched, post-processed, on Beam's timeout thread.
    main, dlq = (
        p
        | "prebatched" >> beam.Create([[f32(1.0), "abc", f32(3.0), f32(5.0)]])
        | "timeout"
        >> RunInference(
            MaybeKeyedModelHandler(BundleModelHandler(HALF_PLUS_TWO, per_element_failures=True))
            .with_no_batching()
            .with_postprocess_fn(lambda r: float(r.inference["y"][0]))
        ).with_exception_handling(timeout=120)
    )
    assert_that(main, equal_to([2.5, 3.5, 4.5]), label="postprocessed")
    assert_that(
        dlq.failed_inferences
        | "timeout dlq" >> beam.MapTuple(lambda batch, error: (list(batch), "element 1 ('abc')" in error[1])),
        equal_to([(["abc"], True)]),
        label="timeout failure",
    )

    # KeyedModelHandler pairs keys with results itself: the batch is dead-lettered whole, never
    # a dead letter in the main output.
    main, dlq = (
        p
        | "keyed" >> beam.Create([("a", f32(1.0)), ("b", "abc"), ("c", f32(3.0))])
        | "keyed batch"
        >> RunInference(
            KeyedModelHandler(BundleModelHandler(HALF_PLUS_TWO, min_batch_size=3, per_element_failures=True))
        ).with_exception_handling()
    )
    assert_that(main, equal_to([]), label="keyed main")
    assert_that(
        dlq.failed_inferences
        | "keyed dlq"
        >> beam.MapTuple(lambda batch, error: (sorted(k for k, _ in batch), "element 1 ('abc')" in error[1])),
        equal_to([(["a", "b", "c"], True)]),
        label="keyed failure",
    )
    result = p.run()
    result.wait_until_finish()
    sizes = result.metrics().query(MetricsFilter().with_namespace("tfservo").with_name("batch_size"))
    eight = [m.committed for m in sizes["distributions"] if "batch of 8" in m.key.step]
    assert [(d.count, d.max) for d in eight] == [(1, 8)]  # one batch of 8 was run
    failed = result.metrics().query(MetricsFilter().with_namespace("tfservo").with_name("failed_inferences"))
    assert sum(m.committed for m in failed["counters"]) == 3


def test_without_the_opt_in_a_failed_batch_is_dead_lettered_whole_naming_the_bad_element() -> None:
    p = beam.Pipeline()
    main, dlq = (
        p
        | beam.Create([f32(1.0), "abc", f32(3.0), f32(5.0)])
        | RunInference(BundleModelHandler(HALF_PLUS_TWO, min_batch_size=4, max_batch_size=4)).with_exception_handling()
    )
    assert_that(main, equal_to([]), label="no results")
    assert_that(
        dlq.failed_inferences | beam.MapTuple(lambda batch, error: (len(batch), "element 1 ('abc')" in error[1])),
        equal_to([(4, True)]),
        label="whole batch",
    )
    p.run().wait_until_finish()


def test_per_element_dead_letters_are_pinned_to_the_tested_beam() -> None:
    from tfservo.batch.adapters import beam_dead_letters as dead_letters

    assert dead_letters.supported(beam.__version__), "requirements-dev.lock pins the Beam these tests check"
    assert not dead_letters.supported("2.78.0") and not dead_letters.supported("3.0.0")


def test_unknown_keyword_arguments_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"signature \(did you mean signature_name\?\)"):
        BundleModelHandler(HALF_PLUS_TWO, signature="regress_x_to_y")
    with pytest.raises(TypeError, match="max_batch_sise"):
        BundleModelHandler(HALF_PLUS_TWO, max_batch_sise=8)


def test_without_exception_handling_a_bad_element_fails_the_pipeline_naming_it() -> None:
    p = beam.Pipeline()
    _ = (
        p
        | beam.Create([f32(1.0), f32(2.0), "abc", f32(4.0)])
        | RunInference(BundleModelHandler(HALF_PLUS_TWO, min_batch_size=4, max_batch_size=4))
    )
    with pytest.raises(Exception, match=r"1 of 4 elements failed .*element 2 \('abc'\): .*expects DT_FLOAT"):
        p.run().wait_until_finish()


def test_load_errors_name_what_to_fix(beam_models: BeamModels) -> None:
    with pytest.raises(
        BundleError, match=r"Model nope is not in .*models are: saved_model_half_plus_two_2_versions"
    ):
        BundleModelHandler(HALF_PLUS_TWO, model_name="nope").load_model()
    with pytest.raises(BundleError, match=r"no loaded version 7 .*loaded versions: 123, 124"):
        BundleModelHandler(HALF_PLUS_TWO, version=7).load_model()
    with pytest.raises(BundleError, match=r"'nope' not found.*available signatures: classify_x2_to_y3"):
        BundleModelHandler(HALF_PLUS_TWO, signature_name="nope").load_model()
    with pytest.raises(InvalidArgument, match=r"classify.*serving_default.*pass signature_name= or method="):
        BundleModelHandler(HALF_PLUS_TWO, method="classify").load_model()
    with pytest.raises(ValueError, match="content_type="):
        BundleModelHandler(HALF_PLUS_TWO, accept="text/csv")
    with pytest.raises(ValueError, match="prediction_log"):
        BundleModelHandler(HALF_PLUS_TWO, content_type="text/csv", output="prediction_log")
    with pytest.raises(ValueError, match="inference_args"):
        BundleModelHandler(HALF_PLUS_TWO).validate_inference_args({"training": False})


def test_run_inference_reports_bad_elements_and_runs_ragged_ones(beam_models: BeamModels) -> None:
    handler = BundleModelHandler(beam_models.two_inputs)
    model = handler.load_model()
    batch = [{"a": [1.0, 1.0], "b": [1.0, 1.0]}, {"a": [1.0, 1.0]}, {"a": [2.0, 2.0], "b": [1.0, 3.0]}]
    with pytest.raises(ElementErrors) as caught:
        handler.run_inference(batch, model)
    error = caught.value
    assert [f.index for f in error.failures] == [1]
    assert "element 1 ({'a': [1.0, 1.0]}): " in error.message
    assert "missing b" in error.message
    copy = pickle.loads(pickle.dumps(error))  # crosses Beam's process boundaries intact
    assert type(copy) is ElementErrors and copy.message == error.message and copy.code == error.code
    # The good elements run fine without it.
    results = handler.run_inference([batch[0], batch[2]], model)
    assert [float(r.inference["total"]) for r in results] == [4.0, 8.0]
    model.close()

    # Elements that cannot be stacked into one batch: the ones that disagree with the rest fail
    # (as /invocations refuses the same instances in one body), the rest are answered together.
    five = BundleModelHandler(beam_models.five)
    model = five.load_model()
    with pytest.raises(ElementErrors) as caught:
        five.run_inference([f32(2.0)[0], f32(3.0, 4.0), f32(5.0)[0]], model)
    assert [f.index for f in caught.value.failures] == [1]
    assert "its instances are x: float32 of shape [2], the rest of its mini-batch's are x: float32 of shape []" in (
        caught.value.message
    )
    alone = five.run_inference([f32(3.0, 4.0)], model)  # alone, it is a request of its own
    assert [r.inference["y"].tolist() for r in alone] == [[15.0, 20.0]]
    model.close()


def test_s3_bundle(s3_bucket: str, s3_endpoint: str, beam_models: BeamModels) -> None:
    url = upload_dir(s3_endpoint, s3_bucket, "models/multiply_five", beam_models.five)
    handler = BundleModelHandler(url)
    model = handler.load_model()
    results = handler.run_inference([f32(2.0)[0], f32(4.0)[0]], model)
    assert [(float(r.inference["y"]), r.model_id) for r in results] == [
        (10.0, "multiply_five/1"),
        (20.0, "multiply_five/1"),
    ]
    model.close()
