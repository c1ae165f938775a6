"""A boto3 session without a region gets SageMaker's default one, with its credentials kept,
through boto3's public API only."""

from __future__ import annotations

import boto3

from tfservo.sagemaker_sdk.session import _with_region


def test_a_session_without_a_region_keeps_its_keys_and_gets_the_default_region(monkeypatch) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    explicit = _with_region(boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                                          aws_session_token="token"), "us-east-1")
    keys = explicit.get_credentials().get_frozen_credentials()
    assert explicit.region_name == "us-east-1" and (keys.access_key, keys.secret_key, keys.token) == (
        "AKIDEXAMPLE", "secret", "token")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    found = _with_region(boto3.Session(), "eu-west-1")
    assert found.region_name == "eu-west-1" and found.get_credentials().access_key == "from-env"
