"""Batch work: the transform (SageMaker's batch semantics over local folders and fsspec URLs), its
engines, the batch worker every engine and pipeline adapter runs, and `tfservo evaluate`.

`job` (parameters), `sources`/`records`/`joiner`/`assemble`/`sinks`/`state` (pure pieces any
engine reuses), `calls` (one batch through the invocation path), `engines/` (local, Beam, Ray,
Spark), `worker/` (a bundle loaded in a worker, batches in, per-element failures out),
`adapters/` (Beam handlers), `run` (load the model once and run a job in this process).
"""
