"""BundleModelHandler in streaming pipelines: TestStream on the DirectRunner in streaming mode,
with watermarks and late data, fixed and sliding windows and keys. Each window's outputs equal a
bounded run's over the same timestamped elements, and no element is lost or answered twice."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Duration
from beam_models import BeamModels, beam_models  # noqa: F401

from tfservo.beam import BundleModelHandler

# (key, x, event time in seconds); y = 5·x. The stream delivers them in this order, with the
# watermark moved past the first two windows before the late element of [0, 10) arrives.
ON_TIME = [("a", 1.0, 1), ("b", 2.0, 4), ("a", 3.0, 12), ("b", 4.0, 15), ("a", 5.0, 19)]
LATE = [("b", 6.0, 7)]  # in [0, 10), after the watermark reached 20: within the allowed lateness
LATER = [("a", 7.0, 25), ("b", 8.0, 31)]
ALL = ON_TIME + LATE + LATER


class _WindowOf(beam.DoFn):
    """(window start, key, y): where each answer landed."""

    def process(self, keyed, w=beam.DoFn.WindowParam):
        key, result = keyed
        yield (int(w.start), key), round(float(result.inference["y"]), 3)


def _per_window(stream: beam.PCollection, windowing: window.WindowFn, handler: BundleModelHandler, name: str):
    """Window, infer by key, group each window's answers (a late pane too): ((start, key), y) per answer."""
    return (
        stream
        | f"{name}: window" >> beam.WindowInto(windowing, allowed_lateness=Duration(seconds=60),
                                     trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                                     accumulation_mode=trigger.AccumulationMode.DISCARDING)
        | f"{name}: infer" >> RunInference(KeyedModelHandler(handler))
        | f"{name}: where" >> beam.ParDo(_WindowOf())
        | f"{name}: per window" >> beam.GroupByKey()  # fires on time, and again for the late element
        | f"{name}: answers" >> beam.FlatMapTuple(lambda where, ys: [(where, y) for y in ys])
    )


def _bounded(windowing: window.WindowFn, handler: BundleModelHandler, folder: Path) -> list:
    """The same elements as a bounded PCollection."""
    with beam.Pipeline() as p:
        out = _per_window(
            p | beam.Create(ALL) | beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2])),
            windowing, handler, "bounded")
        out | beam.Map(json.dumps) | beam.io.WriteToText(str(folder / "out"))
    rows = [json.loads(line) for path in sorted(folder.glob("out*")) for line in path.read_text().splitlines()]
    return sorted(((start, key), y) for (start, key), y in rows)


def _streaming_options() -> PipelineOptions:
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return options


def _stream() -> TestStream:
    def stamped(items):
        return [window.TimestampedValue((k, x), t) for k, x, t in items]

    return (TestStream()
            .advance_watermark_to(0)
            .add_elements(stamped(ON_TIME))
            .advance_watermark_to(20)  # [0, 10) and [10, 20) fire on time
            .add_elements(stamped(LATE))  # a late pane for [0, 10)
            .add_elements(stamped(LATER))
            .advance_watermark_to_infinity())


def test_fixed_and_sliding_windows_with_late_data_match_a_bounded_run(beam_models: BeamModels, tmp_path) -> None:
    handler = BundleModelHandler(beam_models.five, max_batch_size=4)
    fixed, sliding = window.FixedWindows(10), window.SlidingWindows(20, 10)
    expected_fixed = _bounded(fixed, handler, tmp_path / "fixed")
    expected_sliding = _bounded(sliding, handler, tmp_path / "sliding")
    # the bounded runs are what the windows should hold: every element once per window it falls in
    assert len(expected_fixed) == len(ALL) and len(expected_sliding) == 2 * len(ALL)
    assert [y for where, y in expected_fixed if where == (0, "b")] == [10.0, 30.0]  # the late element's window

    with beam.Pipeline(options=_streaming_options()) as p:
        stream = p | _stream()
        assert_that(_per_window(stream, fixed, handler, "fixed"), equal_to(expected_fixed), label="fixed")
        assert_that(_per_window(stream, sliding, handler, "sliding"), equal_to(expected_sliding), label="sliding")


def test_post_processing_and_two_models_in_sequence_on_a_stream(beam_models: BeamModels) -> None:
    """The TFX patterns on unbounded input: y = 10·(5·x), post-processed, per key and window."""
    five = KeyedModelHandler(BundleModelHandler(beam_models.five))
    ten = KeyedModelHandler(BundleModelHandler(beam_models.ten))
    with beam.Pipeline(options=_streaming_options()) as p:
        answers = (
            p
            | _stream()
            | beam.WindowInto(window.FixedWindows(10), allowed_lateness=Duration(seconds=60))
            | "first" >> RunInference(five)
            | "between" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"])))
            | "second" >> RunInference(ten)
            | "post" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"]), r.model_id))
        )
        assert_that(answers, equal_to([(k, 50.0 * x, "multiply_ten/1") for k, x, _ in ALL]))
