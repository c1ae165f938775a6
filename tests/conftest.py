"""Shared test fixtures: paths to the real test data and server processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTDATA = Path(os.environ.get("TFSERVO_TESTDATA", REPO.parent / "shared" / "testdata")).resolve()
TFS = TESTDATA / "tf-serving"
SMC = TESTDATA / "sagemaker-tfs-container"


@pytest.fixture(scope="session")
def testdata() -> Path:
    if not TESTDATA.is_dir():
        pytest.fail(f"test data not found at {TESTDATA}; set TFSERVO_TESTDATA")
    return TESTDATA


from s3_server import s3_bucket, s3_endpoint  # noqa: E402,F401  (moto S3 fixtures for all tests)
