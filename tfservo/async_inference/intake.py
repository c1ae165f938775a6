"""InvokeEndpointAsync's request checked as SageMaker checks it, and queued: where its input is
(an s3:// URL, a local file under --async-input-root, or the request's own body), where its
answer and error will be, its TTL and time limit. Every refusal is InvalidArgument (the runtime
API answers it as botocore's ValidationError), naming the header."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tfservo.async_inference.config import AsyncConfig
from tfservo.async_inference.queue import AsyncQueue, AsyncRequest, Submission
from tfservo.core.errors import InvalidArgument

__all__ = ["AsyncCall", "AsyncIntake", "DEFAULT_TTL_SECONDS", "DEFAULT_TIMEOUT_SECONDS"]

DEFAULT_TTL_SECONDS = 21600  # 6 hours, SageMaker's default and most
DEFAULT_TIMEOUT_SECONDS = 900  # 15 minutes, SageMaker's default (at most an hour)
_EXTENSION = re.compile(r"(?!s3:|https:)[a-zA-Z0-9!_.*'()/-]{1,512}")
_FILENAME = re.compile(r"(?!.*\..*\.)[a-zA-Z0-9][a-zA-Z0-9\-_.]{0,31}")


@dataclass(frozen=True)
class AsyncCall:
    """The InvokeEndpointAsync headers (as sent; None where absent) and body."""

    inference_id: str | None = None
    input_location: str | None = None
    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None
    ttl_seconds: str | None = None
    timeout_seconds: str | None = None
    output_extension: str | None = None
    filename: str | None = None
    body: bytes = b""


class AsyncIntake:
    """Checks and queues InvokeEndpointAsync calls, then wakes the runner."""

    def __init__(self, queue: AsyncQueue, config: AsyncConfig, *, input_root: str | None = None,
                 wake: Callable[[], None] = lambda: None) -> None:
        self.queue = queue
        self.config = config
        self.input_root = os.path.realpath(input_root) if input_root else None
        self._wake = wake  # the runner's: a thread takes the request now

    def submit(self, call: AsyncCall) -> AsyncRequest:
        """Store the call durably (the 202 may then be sent); the stored request."""
        inference_id = call.inference_id or str(uuid.uuid4())
        ttl = _seconds(call.ttl_seconds, "requestTTLSeconds", DEFAULT_TTL_SECONDS, 60, 21600)
        timeout = _seconds(call.timeout_seconds, "invocationTimeoutSeconds", DEFAULT_TIMEOUT_SECONDS, 1, 3600)
        folder = ""
        if call.output_extension is not None:
            if not _EXTENSION.fullmatch(call.output_extension):
                raise InvalidArgument(
                    f"1 validation error detected: Value '{call.output_extension[:100]}' at 's3OutputPathExtension' "
                    "failed to satisfy constraint: letters, digits and !_.*'()/- only, not starting with s3: or https:"
                )
            folder = call.output_extension.strip("/") + "/"
        if call.filename is not None and not _FILENAME.fullmatch(call.filename):
            raise InvalidArgument(
                f"1 validation error detected: Value '{call.filename[:100]}' at 'filename' failed to satisfy "
                "constraint: at most 32 letters, digits, -, _ and one '.', starting with a letter or digit"
            )
        source = self._input(inference_id, call)
        request = Submission(
            id=inference_id,
            input=source,
            content_type=call.content_type,
            accept=call.accept,
            custom_attributes=call.custom_attributes,
            output=f"{self.config.output_path}/{folder}{call.filename or inference_id + '.out'}",
            failure=f"{self.config.failure_path}/{folder}{inference_id}-error.out",
            ttl=ttl,
            timeout=timeout,
        )
        stored = self.queue.submit(request)
        self._wake()
        return stored

    def _input(self, inference_id: str, call: AsyncCall) -> str:
        """Where the request's body is: its InputLocation, checked, or its own body kept in the state folder."""
        location = call.input_location
        if location is None:
            if not call.body:
                raise InvalidArgument(
                    "InputLocation is required: put the request body in S3 and give its s3:// URL "
                    "(X-Amzn-SageMaker-InputLocation)"
                )
            return self._keep_body(inference_id, call.body)
        if location.startswith("s3://"):
            if len(location) <= len("s3://") or location.endswith("/"):
                raise InvalidArgument(f"InputLocation {location} names no object; give s3://BUCKET/KEY")
            return location
        if location.startswith(("https://", "http://")):
            raise InvalidArgument(f"InputLocation {location[:200]}: give the object's s3:// URL")
        path = location.removeprefix("file://")
        if self.input_root is None:
            raise InvalidArgument(
                f"InputLocation {location[:200]} is a local file, and this server takes local inputs only under "
                "--async-input-root DIR; give an s3:// URL, or start it with that flag"
            )
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.input_root]) != self.input_root:
            raise InvalidArgument(f"InputLocation {location[:200]} is outside --async-input-root {self.input_root}")
        if not os.path.isfile(real):
            raise InvalidArgument(f"InputLocation {location[:200]}: no such file")
        return real

    def _keep_body(self, inference_id: str, body: bytes) -> str:
        """The request's body written (and synced) into the state folder: its input."""
        folder = os.path.join(self.queue.folder, "bodies")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, uuid.uuid5(uuid.NAMESPACE_URL, inference_id).hex)
        with open(path + ".tmp", "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        return path


def _seconds(text: str | None, field: str, default: int, lowest: int, highest: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"1 validation error detected: Value '{text[:40]}' at '{field}' is not an integer") from None
    if not lowest <= value <= highest:
        raise InvalidArgument(
            f"1 validation error detected: Value '{value}' at '{field}' failed to satisfy constraint: Member must "
            f"have value between {lowest} and {highest}"
        )
    return value
