"""The TFX blog's four RunInference patterns with tfservo bundles, on any Beam runner.

    .venv/bin/python examples/beam_tfx_patterns.py                     # DirectRunner, temp models
    .venv/bin/python examples/beam_tfx_patterns.py --models-dir /tmp/m --runner DirectRunner \\
        --direct_num_workers=2 --direct_running_mode=multi_processing

It builds two models from code (y = 5·x and y = 10·x, each a bundle dir with version 1), reads
keyed records ("key,value" lines) from examples/beam_tfx_input.csv and runs:

  1 predict        RunInference(BundleModelHandler(...)) on plain values
  2 post-process   a Map that prints each input beside its output
  3 keys           KeyedModelHandler: keys travel with their records
  4 several models the two models side by side (4a), one after the other (4b), and chosen per
                   key with KeyModelMapping (4c)

Each output line starts with its pattern's tag, e.g. `[3 keys] first: 1.0 -> 5.0`. Flags not
listed below are Beam pipeline options (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

from tfservo.core.logs import quiet_tensorflow

if __name__ == "__main__":  # before TensorFlow loads; importing this file (tests do) changes nothing
    quiet_tensorflow()
    # Beam 2.77 warns once per model load that it cannot measure memory when torch is not installed.
    logging.getLogger().addFilter(lambda rec: "Resource module is not available" not in rec.getMessage())

import apache_beam as beam
from apache_beam.ml.inference.base import KeyedModelHandler, KeyModelMapping, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from tfservo.beam import BundleModelHandler

HERE = os.path.dirname(os.path.abspath(__file__))
FACTORS = {"multiply_five": 5.0, "multiply_ten": 10.0}


def build_multiply_model(models_dir: str, name: str, factor: float) -> str:
    """Save `name` version 1 (y = factor·x, input x: float32[None]) under models_dir; returns its dir."""
    import tensorflow as tf

    class Multiply(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.factor = tf.Variable(factor)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * self.factor}

    bundle = os.path.join(models_dir, name)
    module = Multiply()
    tf.saved_model.save(
        module, os.path.join(bundle, "00000001"), signatures={"serving_default": module.serve}
    )
    return bundle


def parse_record(line: str) -> tuple[str, float]:
    """`key,value` → (key, value)."""
    key, value = line.split(",")
    return key.strip(), float(value)


def run(input_path: str, five: str, ten: str, keys: list[str], beam_args: list[str]) -> None:
    """Build and run the pipeline with the four patterns."""
    value_of = lambda result: float(result.inference["y"])

    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        records = p | "Read" >> beam.io.ReadFromText(input_path) | "Parse" >> beam.Map(parse_record)
        values = records | "Values" >> beam.Values()

        # 1 predict, 2 post-process
        predictions = values | "1 Predict x5" >> RunInference(BundleModelHandler(five))
        _ = predictions | "1 Print" >> beam.Map(
            lambda r: print(f"[1 predict] {r.example} -> {r.inference} ({r.model_id})")
        )
        _ = predictions | "2 Post-process" >> beam.Map(
            lambda r: print(f"[2 post-process] {float(r.example)} * 5 = {value_of(r)}")
        )

        # 3 keys
        keyed = records | "3 Predict x5 keyed" >> RunInference(KeyedModelHandler(BundleModelHandler(five)))
        _ = keyed | "3 Print" >> beam.MapTuple(
            lambda k, r: print(f"[3 keys] {k}: {float(r.example)} -> {value_of(r)}")
        )

        # 4a several models side by side: the same records through both
        tens = records | "4a Predict x10 keyed" >> RunInference(KeyedModelHandler(BundleModelHandler(ten)))
        _ = keyed | "4a Print x5" >> beam.MapTuple(
            lambda k, r: print(f"[4a parallel x5] {k}: {float(r.example)} -> {value_of(r)}")
        )
        _ = tens | "4a Print x10" >> beam.MapTuple(
            lambda k, r: print(f"[4a parallel x10] {k}: {float(r.example)} -> {value_of(r)}")
        )

        # 4b several models one after the other: x5, keep the first input, then x10
        chained = (
            keyed
            | "4b To next input" >> beam.MapTuple(lambda k, r: (k, (float(r.example), value_of(r))))
            | "4b Keep first input" >> beam.MapTuple(lambda k, pair: ((k, pair[0]), pair[1]))
            | "4b Predict x10" >> RunInference(KeyedModelHandler(BundleModelHandler(ten)))
        )
        _ = chained | "4b Print" >> beam.MapTuple(
            lambda k, r: print(
                f"[4b sequence x5 then x10] {k[0]}: {k[1]} -> {float(r.example)} -> {value_of(r)}"
            )
        )

        # 4c several models chosen per key: every other key goes to the x10 model
        per_key = KeyedModelHandler(
            [
                KeyModelMapping(keys[0::2], BundleModelHandler(five)),
                KeyModelMapping(keys[1::2], BundleModelHandler(ten)),
            ]
        )
        routed = records | "4c Predict per key" >> RunInference(per_key)
        _ = routed | "4c Print" >> beam.MapTuple(
            lambda k, r: print(
                f"[4c per key] {k}: {float(r.example)} -> {value_of(r)} ({r.model_id.split('/')[0]})"
            )
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default=os.path.join(HERE, "beam_tfx_input.csv"), help="key,value lines")
    parser.add_argument("--models-dir", default=None, help="where to build the models [default: a temp dir]")
    args, beam_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfservo-beam-example-") as tmp:
        models_dir = args.models_dir or tmp
        five, ten = (build_multiply_model(models_dir, name, f) for name, f in FACTORS.items())
        with open(args.input) as f:
            keys = [parse_record(line)[0] for line in f if line.strip()]
        run(args.input, five, ten, keys, beam_args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
