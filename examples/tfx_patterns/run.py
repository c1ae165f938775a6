"""The TFX blog's RunInference patterns with a tfservo bundle, end to end through files:
tf.Examples read from a TFRecord file, RunInference on the bundle's regress signature with
PredictionLog output, the PredictionLogs written to a TFRecord file, and the post-processed
(input, output) pairs printed; then the blog's four in-memory patterns
(examples/beam_tfx_patterns.py: predict, post-process, keys, several models).

    .venv/bin/python examples/tfx_patterns/run.py                       # DirectRunner
    .venv/bin/python examples/tfx_patterns/run.py --work /tmp/tfx --direct_num_workers=2

Flags not listed are Beam pipeline options.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from example_tools import quiet_tensorflow  # noqa: E402

if __name__ == "__main__":
    quiet_tensorflow()

import apache_beam as beam  # noqa: E402
import beam_tfx_patterns  # noqa: E402
import tensorflow as tf  # noqa: E402
from apache_beam.ml.inference.base import RunInference  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from build_models import build_half_plus_ten  # noqa: E402
from tensorflow_serving.apis import prediction_log_pb2  # noqa: E402

from tfservo.beam import BundleModelHandler  # noqa: E402


def write_examples(path: Path, values: list[float]) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for x in values:
            example = tf.train.Example(features=tf.train.Features(feature={"x": tf.train.Feature(
                float_list=tf.train.FloatList(value=[x]))}))
            writer.write(example.SerializeToString())


def pair_of(log: prediction_log_pb2.PredictionLog) -> str:
    """Post-processing: the input x beside the model's output, from the PredictionLog itself."""
    regress = log.regress_log
    example = regress.request.input.example_list.examples[0]
    x = example.features.feature["x"].float_list.value[0]
    y = regress.response.result.regressions[0].value
    return f"[5 tfrecords] x={x:g} -> y={y:g} ({regress.response.model_spec.name} v{regress.response.model_spec.version.value})"


def run_tfrecords(bundle: str, examples: Path, logs_prefix: Path, beam_args: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        logs = (
            pipeline
            | "Read tf.Examples" >> beam.io.ReadFromTFRecord(str(examples), coder=beam.coders.ProtoCoder(tf.train.Example))
            | "Regress" >> RunInference(BundleModelHandler(bundle, signature_name="regress_x_to_y", output="prediction_log"))
        )
        _ = logs | "Write PredictionLogs" >> beam.io.WriteToTFRecord(
            str(logs_prefix), coder=beam.coders.ProtoCoder(prediction_log_pb2.PredictionLog), file_name_suffix=".tfrecord"
        )
        _ = logs | "Post-process" >> beam.Map(pair_of) | "Print" >> beam.Map(print)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="models, input and PredictionLogs go here [a temp dir]")
    args, beam_args = parser.parse_known_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="tfservo-tfx-"))
    work.mkdir(parents=True, exist_ok=True)
    build_half_plus_ten(str(work / "models"))
    examples = work / "examples.tfrecord"
    write_examples(examples, [1.0, 2.0, 3.0, 4.0, 10.0])
    run_tfrecords(str(work / "models" / "half_plus_ten"), examples, work / "prediction_logs", beam_args)
    written = sorted(work.glob("prediction_logs*.tfrecord"))
    count = sum(1 for path in written for _ in tf.data.TFRecordDataset(str(path)))
    print(f"[5 tfrecords] {count} PredictionLogs in {', '.join(p.name for p in written)}")
    sys.stdout.flush()
    beam_tfx_patterns.main(["--models-dir", str(work / "multiply"), *beam_args])


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
