"""Runs queued asynchronous requests through the service's one Invoker — what /invocations does:
content conversion, the bundle's handlers, custom attributes — and writes each answer to its
output location (or its error to its failure location) before it is marked done and notified.

Each worker process runs up to MaxConcurrentInvocationsPerInstance threads; the queue caps the
requests running at once across all of them."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable

from tfservo.async_inference.config import AsyncConfig
from tfservo.async_inference.notify import Notifier, notification
from tfservo.async_inference.queue import AsyncQueue, AsyncRequest
from tfservo.core import deadlines
from tfservo.core.errors import ServingError
from tfservo.service.factory import ModelService
from tfservo.service.invocation import InvocationResult, error_result
from tfservo.storage.retry import retry, storage_error_is_transient
from tfservo.storage.urls import is_local, url_to_fs

__all__ = ["AsyncRunner", "read_object", "write_object"]

log = logging.getLogger("tfservo.async")

_IDLE_WAIT = 0.5  # how often an idle thread looks for requests other workers queued
_RETRY_FIRST, _RETRY_MAX = 1.0, 60.0  # seconds before a request whose result could not be written runs again
# Write errors that pass (space returns, the store comes back): the request stays queued.
_PASSING = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EROFS}


class _NotWritten(Exception):
    """An answer or error object that could not be written for a reason that passes."""


def _passes(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in _PASSING) or storage_error_is_transient(exc)


def read_object(url: str) -> bytes:
    """The whole object at an s3:// URL or local path (storage errors that may pass retried)."""
    fs, path = url_to_fs(url)
    data: bytes = retry(lambda: fs.cat_file(path), f"reading {url}")
    return data


def write_object(url: str, data: bytes) -> None:
    """Write `data` at `url` whole or not at all: S3 puts are atomic, a local file is written
    beside its name and renamed into place."""
    fs, path = url_to_fs(url)
    if is_local(fs):
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".tfservo-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:  # a full disk, say: no half-written file left behind
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        return
    retry(lambda: fs.pipe_file(path, data), f"writing {url}")


class AsyncRunner:
    """The threads of one worker process that run the queue's requests."""

    def __init__(
        self,
        service: ModelService,
        queue: AsyncQueue,
        config: AsyncConfig,
        *,
        endpoint: str,
        region: str,
        on_event: Callable[[str, float], None] = lambda event, seconds: None,
        on_backlog: Callable[[dict[str, int]], None] = lambda counts: None,
    ) -> None:
        self.service = service
        self.queue = queue
        self.config = config
        self.endpoint = endpoint
        self.region = region
        self.on_event = on_event  # ("completed" | "failed" | "expired" | "claimed", seconds): the metrics
        self.on_backlog = on_backlog  # the queue's counts by state, after each change seen here
        self.notifier = Notifier()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._retry: dict[str, tuple[float, float]] = {}  # id → (monotonic time it may run again, its wait)
        self._retry_lock = threading.Lock()

    def start(self) -> AsyncRunner:
        for i in range(self.config.max_concurrent):
            thread = threading.Thread(target=self._loop, name=f"tfservo-async-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wake(self) -> None:
        """A request was queued in this process: an idle thread takes it now."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more requests; wait up to `timeout` for those running (a request still
        running then is run again by the next server on the folder)."""
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                request = self.queue.claim(self.config.max_concurrent, skip=self._waiting())
                self.on_backlog(self.queue.counts())
            except Exception:
                log.exception("async queue %s: cannot take a request", self.queue.path)
                request = None
            if request is None:
                self._wake.wait(_IDLE_WAIT)
                self._wake.clear()
                continue
            self.on_event("claimed", time.time() - request.received)
            try:
                self.run(request)
                with self._retry_lock:
                    self._retry.pop(request.id, None)
            except _NotWritten as exc:
                self._defer(request, str(exc))
            except Exception:  # a bug of ours: the request stays running until this process is gone
                log.exception("async request %s failed unexpectedly", request.id)

    def run(self, request: AsyncRequest) -> None:
        """Run one claimed request to its end: answer or failure written, recorded, notified."""
        if time.time() > request.expires:
            waited = request.expires - request.received
            self._fail(request, "expired", f"Request expired: it waited in the queue past its RequestTTLSeconds "
                       f"({waited:.0f} s)", None)
            return
        try:
            body = read_object(request.input)
        except Exception as exc:
            self._fail(request, "failed", f"ClientError: cannot read the input {request.input}: "
                       f"{type(exc).__name__}: {exc}", None)
            return
        result = self._invoke(request, body)
        if not result.ok:
            reason = (f"ClientError: Received {'client' if result.status < 500 else 'server'} error "
                      f"({result.status}) from the model: {result.body.decode('utf-8', 'replace')[:1000]}")
            if result.status == 415 and request.content_type is None:  # the SDK's AsyncPredictor sends none
                reason += (" (InvokeEndpointAsync had no ContentType: give one, e.g. the SDK's "
                           "predict_async(data, initial_args={'ContentType': 'application/json'}))")
            self._fail(request, "failed", reason, result)
            return
        answer = result.body
        try:
            write_object(request.output, answer)
        except Exception as exc:
            if _passes(exc):
                raise _NotWritten(f"cannot write the answer to {request.output}: {type(exc).__name__}: {exc}") from exc
            self._fail(request, "failed", f"InternalFailure: cannot write the answer to {request.output}: "
                       f"{type(exc).__name__}: {exc}", None)
            return
        self.queue.finish(request.id, "completed")
        self.on_event("completed", time.time() - request.received)
        log.info("async %s completed: %s", request.id, request.output)
        if self.config.success_topic:
            include = "SUCCESS_NOTIFICATION_TOPIC" in self.config.include_response_in
            self.notifier.send(self.config.success_topic, notification(
                request, endpoint=self.endpoint, region=self.region, completed=True,
                content_type=result.content_type, body=answer if include else None,
            ))

    def _waiting(self) -> list[str]:
        """Requests whose result could not be written, still waiting to run again."""
        now = time.monotonic()
        with self._retry_lock:
            return [rid for rid, (when, _) in self._retry.items() if when > now]

    def _defer(self, request: AsyncRequest, why: str) -> None:
        """The request's result could not be written (a full disk, a store away): it goes back
        to the queue, kept, and runs again after a wait that doubles (this process) or at the
        next start; nothing accepted is dropped."""
        with self._retry_lock:
            wait = min(_RETRY_MAX, self._retry[request.id][1] * 2) if request.id in self._retry else _RETRY_FIRST
            self._retry[request.id] = (time.monotonic() + wait, wait)
        self.queue.release(request.id)
        self.on_event("deferred", time.time() - request.received)
        log.warning("async %s kept queued: %s; it runs again in %.0f s", request.id, why, wait)

    def _invoke(self, request: AsyncRequest, body: bytes) -> InvocationResult:
        """The invocation /invocations would run, within the request's InvocationTimeoutSeconds."""
        try:
            with deadlines.within(request.timeout):
                result = self.service.invoker.invoke(body, request.content_type, request.accept,
                                                     request.custom_attributes)
                if deadlines.expired(deadlines.current()):
                    raise deadlines.DeadlineExceeded(
                        f"the invocation took longer than its InvocationTimeoutSeconds ({request.timeout:g} s)"
                    )
                return result
        except ServingError as exc:
            return error_result(exc)

    def _fail(self, request: AsyncRequest, state: str, reason: str, result: InvocationResult | None) -> None:
        """Write the error where the request's failures go, record it, notify the error topic."""
        body = result.body if result is not None else reason.encode()
        content_type = result.content_type if result is not None else "text/plain"
        try:
            write_object(request.failure, body)
        except Exception as exc:
            if _passes(exc):
                raise _NotWritten(f"cannot write its error to {request.failure}: {type(exc).__name__}: {exc}") from exc
            log.error("async %s: cannot write its error to %s: %s: %s", request.id, request.failure,
                      type(exc).__name__, exc)
        self.queue.finish(request.id, state, reason)
        self.on_event(state, time.time() - request.received)
        log.warning("async %s %s: %s", request.id, state, reason)
        if self.config.error_topic:
            include = "ERROR_NOTIFICATION_TOPIC" in self.config.include_response_in
            self.notifier.send(self.config.error_topic, notification(
                request, endpoint=self.endpoint, region=self.region, completed=False, content_type=content_type,
                reason=reason, body=body if include else None,
            ))
