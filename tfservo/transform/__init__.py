"""Batch transform: SageMaker's batch semantics over local folders and fsspec URLs.

`job` (parameters), `sources`/`records`/`joiner`/`assemble`/`sinks`/`state` (pure pieces
any runner can reuse), `calls` (one batch through the invocation path), `engine` (the local
scheduler), `run` (load the model once and run a job in this process).
"""
