"""BundleModelHandler on the DirectRunner with two worker processes.

Each worker process loads the bundle once (Beam's shared handle); with
share_model_across_processes=True one process holds the model and the others reach it
through Beam's multi-process proxy, so the values crossing that boundary must pickle.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from beam_models import BeamModels, beam_models  # noqa: F401
from conftest import TFS

from tfservo.beam import BundleModelHandler

HALF_PLUS_TWO = str(TFS / "saved_model_half_plus_two_2_versions")
OPTIONS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def test_multi_processing_direct_runner(beam_models: BeamModels) -> None:
    xs = [float(x) for x in range(20)]
    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        keyed = (
            p
            | "keyed" >> beam.Create([(f"k{int(x)}", np.array([x], dtype=np.float32)) for x in xs])
            | "predict"
            >> RunInference(KeyedModelHandler(BundleModelHandler(HALF_PLUS_TWO, max_batch_size=4)))
            | "out" >> beam.MapTuple(lambda k, r: (k, float(r.inference["y"][0])))
        )
        assert_that(keyed, equal_to([(f"k{int(x)}", 0.5 * x + 2) for x in xs]), label="per process")

        shared = (
            p
            | "values" >> beam.Create(xs)
            | "shared"
            >> RunInference(BundleModelHandler(beam_models.five, share_model_across_processes=True))
            | "shared out" >> beam.Map(lambda r: (r.example, float(r.inference["y"]), r.model_id))
        )
        assert_that(shared, equal_to([(x, 5 * x, "multiply_five/1") for x in xs]), label="across processes")
