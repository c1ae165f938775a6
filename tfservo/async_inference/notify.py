"""Notifications of finished asynchronous requests, in SageMaker's message format: to an SNS
topic (boto3, endpoint and credentials from the usual AWS configuration) or, for users without
SNS, POSTed as JSON to an http(s):// URL named in its place."""

from __future__ import annotations

import base64
import datetime
import logging
import time
from typing import Any

import orjson

from tfservo.async_inference.queue import AsyncRequest
from tfservo.core.retry import Backoff

__all__ = ["Notifier", "notification"]

log = logging.getLogger("tfservo.async")

INCLUDED_BYTES = 128 * 1024  # SageMaker includes an answer of at most 128 KB in the message
_WEBHOOK_RETRY = Backoff(retries=4, base_delay=0.5)


def _iso(when: float) -> str:
    moment = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def notification(
    request: AsyncRequest, *, endpoint: str, region: str, completed: bool, content_type: str,
    reason: str | None = None, body: bytes | None = None,
) -> dict[str, object]:
    """SageMaker's InferenceResult event for one request; `body` included when given and small."""
    response: dict[str, object] = {"contentType": content_type}
    if completed:
        response["outputLocation"] = request.output
    else:
        response["failureLocation"] = request.failure
    message: dict[str, object] = {
        "awsRegion": region,
        "eventTime": _iso(time.time()),
        "receivedTime": _iso(request.received),
        "invocationStatus": "Completed" if completed else "Failed",
        "requestParameters": {
            "contentType": request.content_type or "application/json",
            "endpointName": endpoint,
            "inputLocation": request.input,
        },
        "responseParameters": response,
        "inferenceId": request.id,
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }
    if reason is not None:
        message["failureReason"] = reason
    if body is not None and len(body) <= INCLUDED_BYTES:
        try:
            message["responseBody"] = {"content": body.decode("utf-8"), "encoding": "UTF-8"}
        except UnicodeDecodeError:
            message["responseBody"] = {"content": base64.b64encode(body).decode(), "encoding": "BASE64"}
    return message


class Notifier:
    """Sends a message to a topic: an SNS ARN, or an http(s):// URL (a webhook)."""

    def __init__(self) -> None:
        self._sns: dict[str, Any] = {}

    def send(self, topic: str, message: dict[str, object]) -> None:
        """Deliver, retrying what may pass; a failure is logged, never raised (the answer is
        already in storage)."""
        try:
            if topic.startswith(("http://", "https://")):
                _WEBHOOK_RETRY.call(lambda: self._post(topic, message), retriable=_may_pass)
            else:
                self._publish(topic, message)
        except Exception as exc:
            log.error("could not notify %s of %s: %s: %s", topic, message["inferenceId"], type(exc).__name__, exc)

    def _publish(self, topic: str, message: dict[str, object]) -> None:
        client = self._sns.get(topic)
        if client is None:
            import boto3

            parts = topic.split(":")
            region = parts[3] if len(parts) > 5 and parts[3] else None
            client = self._sns[topic] = boto3.session.Session().client("sns", region_name=region)
        client.publish(TopicArn=topic, Message=orjson.dumps(message).decode())

    @staticmethod
    def _post(url: str, message: dict[str, object]) -> None:
        import httpx

        answer = httpx.post(url, content=orjson.dumps(message), headers={"Content-Type": "application/json"}, timeout=30)
        answer.raise_for_status()


def _may_pass(exc: BaseException) -> bool:
    """A webhook failure worth trying again: no connection, a timeout, a 5xx or 429."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return isinstance(exc, httpx.TransportError)
