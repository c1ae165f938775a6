"""Pytest fixtures for a local S3 (moto's server on 127.0.0.1), so S3 code runs for real without AWS.

Use in a test module with `from s3_server import s3_bucket, s3_endpoint  # noqa: F401`
(tests/ is on sys.path under pytest's default import mode), or import them once in conftest.py.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REGION = "us-east-1"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}
# Anything that could point the session at real AWS or another endpoint is removed.
CLEARED_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
               "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_CA_BUNDLE")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start moto's S3 server on a free port and point AWS_ENDPOINT_URL(_S3) and fake credentials at it."""
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    empty = tmp_path_factory.mktemp("aws-config") / "none"  # no ~/.aws profiles leak in
    with pytest.MonkeyPatch.context() as mp:
        for name in CLEARED_ENV:
            mp.delenv(name, raising=False)
        for name, value in FAKE_ENV.items():
            mp.setenv(name, value)
        mp.setenv("AWS_CONFIG_FILE", str(empty))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        mp.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        try:
            yield endpoint
        finally:
            _forget_s3fs_instances()
            server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on the local S3 server; returns its name."""
    name = f"tfservo-test-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=name)
    return name


def s3_client(endpoint: str):  # -> botocore S3 client
    """A boto3 S3 client for the local server (endpoint given explicitly, not via the environment)."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION,
        aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
    )


def upload_file(endpoint: str, bucket: str, key: str, path: str | os.PathLike[str]) -> str:
    """Upload one local file to s3://bucket/key and return that URL."""
    s3_client(endpoint).upload_file(str(path), bucket, key)
    return f"s3://{bucket}/{key}"


def upload_dir(endpoint: str, bucket: str, prefix: str, path: str | os.PathLike[str]) -> str:
    """Upload a local directory tree under s3://bucket/prefix/ and return that URL."""
    client = s3_client(endpoint)
    root = Path(path)
    prefix = prefix.strip("/")
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        key = "/".join(filter(None, [prefix, file.relative_to(root).as_posix()]))
        client.upload_file(str(file), bucket, key)
    return f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/"


def _forget_s3fs_instances() -> None:
    """Drop cached s3fs filesystems, whose clients point at the server being stopped."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()
