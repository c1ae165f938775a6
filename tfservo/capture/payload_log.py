"""KServe's inference logger: each request and its answer sent as CloudEvents over HTTP (binary
mode) with KServe's attributes, so a receiver written for KServe's logger works unchanged.

Events go through a bounded queue to a sender process (core.offload: the HTTP client's Python
does not take the interpreter's lock from requests); a receiver that is slow or down slows no
request: past the queue's bound events are dropped and counted, and a failed send is counted
and not retried.
"""

from __future__ import annotations

import datetime
import http.client
import logging
import ssl
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tfservo.capture.writer import CaptureEvent
from tfservo.core.extras import require
from tfservo.core.offload import Offload
from tfservo.core.settings import ConfigError

__all__ = ["PayloadLogger"]

log = logging.getLogger("tfservo.capture")

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
_MODES = ("all", "request", "response")


@dataclass(frozen=True)
class _Identity:
    """KServe's extension attributes on every event."""

    source: str
    service: str
    namespace: str
    component: str
    endpoint: str


class PayloadLogger:
    """Sends each submitted event's request and/or response to `url`; `submit` from any thread."""

    def __init__(
        self,
        url: str,
        *,
        mode: str = "all",
        source: str,
        service: str,
        namespace: str = "default",
        component: str = "predictor",
        endpoint: str = "",
        max_queued: int = 1000,
        timeout: float = 5.0,
        on_event: Callable[[str, int], None] = lambda kind, n: None,
    ) -> None:
        if mode not in _MODES:
            raise ConfigError(f"--payload-log-mode must be one of {', '.join(_MODES)}, got {mode!r}")
        require("--payload-log-url", "payload-log", "cloudevents.http")  # here: a missing extra stops the start
        _KeptConnection(url, timeout)  # and a URL that is not one
        self.url = url
        self.mode = mode
        self.on_event = on_event
        identity = _Identity(source, service, namespace, component, endpoint)
        self._offload = Offload(
            _Sender, (url, mode, identity, timeout), name="tfservo-payload-log",
            delay=0.05, max_queue=max_queued, batch=64, on_message=self._note,
        )

    def submit(self, event: CaptureEvent) -> None:
        if not self._offload.add(event):
            self.on_event("payload_dropped", 1)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (within `timeout`), then stop."""
        self._offload.close(timeout)

    def _note(self, message: tuple[int, int]) -> None:
        """What the sender process tells: counts of events sent and failed."""
        sent, failed = message
        if sent:
            self.on_event("payload_sent", sent)
        if failed:
            self.on_event("payload_failed", failed)


class _Sender:
    """The child's side: each event as one or two CloudEvents POSTed to the receiver."""

    def __init__(self, reply: Callable[[tuple[object, ...]], None], url: str, mode: str, identity: _Identity,
                 timeout: float) -> None:
        events = require("--payload-log-url", "payload-log", "cloudevents.http")
        self._event_class, self._to_binary = events.CloudEvent, events.to_binary
        self.reply, self.url, self.mode, self.identity = reply, url, mode, identity
        self._client = _KeptConnection(url, timeout)
        self._failed_once = False

    def handle(self, batch: list[CaptureEvent]) -> None:
        sent = failed = 0
        for event in batch:
            request_id = event.inference_id or str(uuid.uuid4())
            if self.mode in ("all", "request"):
                ok = self._send(REQUEST_TYPE, request_id, event.request_type, event.request_body, event.time)
                sent, failed = sent + ok, failed + (not ok)
            if self.mode in ("all", "response"):
                ok = self._send(RESPONSE_TYPE, request_id, event.response_type, event.response_body, event.time)
                sent, failed = sent + ok, failed + (not ok)
        self.reply((sent, failed))

    def close(self) -> None:
        self._client.close()

    def _send(self, kind: str, request_id: str, content_type: str | None, body: bytes, when: float) -> bool:
        identity = self.identity
        attributes = {
            "type": kind, "source": identity.source, "id": request_id,
            "time": datetime.datetime.fromtimestamp(when, datetime.timezone.utc).isoformat(),
            "datacontenttype": content_type or "application/octet-stream",
            "inferenceservicename": identity.service, "namespace": identity.namespace,
            "component": identity.component, "endpoint": identity.endpoint,
        }
        headers, data = self._to_binary(self._event_class(attributes, body))
        try:
            self._client.post(headers, data)
        except (OSError, http.client.HTTPException) as exc:
            if not self._failed_once:  # one line, not one per event
                self._failed_once = True
                log.warning("payload log: sending to %s failed (%s); events are dropped while it fails", self.url, exc)
            return False
        self._failed_once = False
        return True


class _KeptConnection:
    """POSTs to one URL over one kept-alive connection (made again after a failure). The
    standard library's client: a sixth of httpx's CPU a request (bench/results/observability_cpu.json),
    which is what a logger of every request spends most of."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--payload-log-url {url!r} must be an http:// or https:// URL")
        self._secure, self._host, self._port = parts.scheme == "https", parts.hostname, parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def post(self, headers: dict[str, str], body: bytes) -> None:
        """POST `body`; raises OSError or HTTPException when it was not answered 2xx."""
        for attempt in (1, 2):  # a kept connection the receiver closed meanwhile fails once
            connection = self._connection or self._connect()
            try:
                connection.request("POST", self._path, body=body, headers=headers)
                answer = connection.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if answer.will_close:
                self.close()
            if not 200 <= answer.status < 300:
                raise http.client.HTTPException(f"the receiver answered {answer.status} {answer.reason}")
            return

    def _connect(self) -> http.client.HTTPConnection:
        if self._secure:
            self._connection = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                                           context=ssl.create_default_context())
        else:
            self._connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
