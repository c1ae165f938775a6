"""The process environment: the one module that reads or writes `os.environ`.

tfservo's settings (every TFSERVO_* and SageMaker variable a user sets) are declared and
resolved in core/settings.py, from `current()`. The few other variables tfservo reads are
declared in VARIABLES with who reads them; the variables it writes are those that libraries and
child processes read (`export`), and a child's whole environment is built by `for_child`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["VARIABLES", "current", "export", "export_missing", "for_child", "variable"]

# Variables tfservo reads that are not settings (core/settings.py declares those), and why.
VARIABLES: Mapping[str, str] = {
    "TFSERVO_TF_LOGS": "1 keeps TensorFlow's, gRPC's, Beam's and Spark's own log lines (core/logs.py)",
    "PROMETHEUS_MULTIPROC_DIR": "the metric files every worker of a server shares (prometheus_client reads it too)",
    "TFSERVO_ENDPOINT_URL": "where the SageMaker SDK session sends runtime calls (sagemaker_sdk)",
    "AWS_ENDPOINT_URL_S3": "the S3 endpoint of the SageMaker SDK session (botocore reads it too)",
    "AWS_ENDPOINT_URL": "the AWS endpoint of the SageMaker SDK session (botocore reads it too)",
    "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": "where botocore sends sagemaker-runtime calls (the SDK session checks it)",
}


def current() -> Mapping[str, str]:
    """This process's environment, read-only: what settings and tracing resolve from."""
    return os.environ


def variable(name: str) -> str | None:
    """One of VARIABLES (KeyError for an undeclared name: declare it there, with its reader)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not declared in tfservo.core.environment.VARIABLES")
    return os.environ.get(name)


def export(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (None: unset) variables in this process for what reads them here or in its children
    (handler code, botocore, prometheus_client, TensorFlow); returns what they were, for a
    later `export` that restores them."""
    before = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


def export_missing(values: Mapping[str, str]) -> dict[str, str]:
    """Set those of `values` this process's environment lacks; returns those it set."""
    added = {name: value for name, value in values.items() if name not in os.environ}
    os.environ.update(added)
    return added


def for_child(extra: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child process's environment: this one's, `defaults` where it lacks them, `extra` over all."""
    return {**(defaults or {}), **os.environ, **extra}
