"""A tfservo bundle in a streaming Beam pipeline: timestamped records in fixed 10 s windows, keyed,
through BundleModelHandler, one line per window and key as each window closes (and again for a
late record within the allowed lateness).

TestStream stands in for the unbounded source so the example runs anywhere; in production the
source is Pub/Sub or Kafka (see docs/pipelines/beam.md). Builds its ×5 model from code.

    .venv/bin/python examples/beam_streaming.py [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

from tfservo.core.logs import quiet_libraries

quiet_libraries()  # before Beam and TensorFlow load: their start-up notes stay quiet

import apache_beam as beam  # noqa: E402
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions  # noqa: E402
from apache_beam.testing.test_stream import TestStream  # noqa: E402
from apache_beam.transforms import trigger, window  # noqa: E402
from apache_beam.utils.timestamp import Duration  # noqa: E402
from apache_beam.utils.windowed_value import PaneInfoTiming  # noqa: E402
from beam_tfx_patterns import build_multiply_model  # noqa: E402

from tfservo.beam import BundleModelHandler  # noqa: E402

RECORDS = [("sensor-a", 1.0, 1), ("sensor-b", 2.0, 4), ("sensor-a", 3.0, 12), ("sensor-b", 4.0, 15)]
LATE = [("sensor-b", 6.0, 7)]  # belongs to [0, 10), arrives after the watermark passed 20


class Report(beam.DoFn):
    def process(self, grouped, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        key, ys = grouped
        when = "late" if pane.timing == PaneInfoTiming.LATE else "on time"
        yield f"window [{int(w.start)}, {int(w.end)}) {key}: {sorted(ys)} ({when})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="where the model is built (default: a temporary folder)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="tfservo-stream-")
    os.makedirs(work, exist_ok=True)
    bundle = build_multiply_model(work, "multiply_five", 5.0)

    def stamped(items):
        return [window.TimestampedValue((key, x), t) for key, x, t in items]

    stream = (TestStream().advance_watermark_to(0).add_elements(stamped(RECORDS))
              .advance_watermark_to(20).add_elements(stamped(LATE)).advance_watermark_to_infinity())
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    with beam.Pipeline(options=options) as p:
        (p
         | stream
         | beam.WindowInto(window.FixedWindows(10), allowed_lateness=Duration(seconds=60),
                           trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                           accumulation_mode=trigger.AccumulationMode.DISCARDING)
         | RunInference(KeyedModelHandler(BundleModelHandler(bundle)))
         | beam.MapTuple(lambda key, result: (key, float(result.inference["y"])))
         | beam.GroupByKey()
         | beam.ParDo(Report())
         | beam.Map(print))


if __name__ == "__main__":
    main()
