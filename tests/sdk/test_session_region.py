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


def test_a_general_aws_endpoint_is_named_as_the_trap_it_is(monkeypatch, caplog) -> None:
    """AWS_ENDPOINT_URL sends sagemaker-runtime calls there too: the session says so, and what to
    set instead; with AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME set it says nothing."""
    import logging

    from tfservo.sagemaker_sdk.session import _warn_of_a_general_endpoint

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.delenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", raising=False)
    with caplog.at_level(logging.WARNING, logger="tfservo.sagemaker_sdk"):
        _warn_of_a_general_endpoint("http://127.0.0.1:8080")
    assert "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME" in caplog.text and "not to http://127.0.0.1:8080" in caplog.text
    caplog.clear()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", "http://127.0.0.1:8080")
    with caplog.at_level(logging.WARNING, logger="tfservo.sagemaker_sdk"):
        _warn_of_a_general_endpoint("http://127.0.0.1:8080")
    assert caplog.text == ""
