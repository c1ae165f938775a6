"""The gRPC server: grpc.aio on an event loop of its own (uvloop when installed), in one thread.

Predicts are decoded on the loop and queued for their batch (service.queued_calls), as HTTP's
are: no thread per call waits for a batch. Every other method runs in the loop's thread pool
(grpc.methods.threaded). The sync interface — construct, `add_service`, `start`, `stop(grace)`
returning an Event — lets the serving process start and stop it beside uvicorn.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc

from tfservo.auth.audit import ManagementGate
from tfservo.capture.taps import Taps
from tfservo.codecs.tensor_proto import MAX_FILL_BYTES
from tfservo.core.errors import Unavailable
from tfservo.core.request_labels import RequestScope, plain_scope
from tfservo.grpc.methods import service_handler
from tfservo.grpc.tfserving import (
    MODEL_METHODS,
    MODEL_SERVICE,
    PREDICTION_METHODS,
    PREDICTION_SERVICE,
    ModelServicer,
    PredictionServicer,
    ReloadConfig,
)
from tfservo.service.api import TFServingAPI
from tfservo.service.call_placement import CallPlacement
from tfservo.service.queued_calls import QueuedCalls

__all__ = ["GrpcServer"]

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class GrpcServer:
    """TF Serving's gRPC services (and those added) on one port; `gate` decides and records its
    management method (None: open, unrecorded); `taps` take its inference methods' payloads. `batched`: the service batches calls, so small
    predicts are queued from the loop; `max_queued`: --max-queued-per-model."""

    def __init__(
        self,
        api: TFServingAPI,
        *,
        host: str = "127.0.0.1",
        port: int | None = 9000,
        max_message_bytes: int = 100 * 2**20,
        workers: int = 64,
        batched: bool = False,
        max_queued: int = 256,
        scope: RequestScope = plain_scope,
        reload_config: Callable[[], ReloadConfig | None] = lambda: None,
        reuse_port: bool = False,
        credentials: grpc.ServerCredentials | None = None,
        draining: Callable[[], bool] = lambda: False,
        socket_path: str | None = None,
        options: Sequence[tuple[str, int | str]] = (),
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        gate: ManagementGate | None = None,
        taps: Taps | None = None,
        placement: CallPlacement | None = None,
    ) -> None:
        self._loop = _new_loop()
        self._threads = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfservo-grpc")
        self._loop.set_default_executor(self._threads)
        self._thread = threading.Thread(target=self._loop.run_forever, name="tfservo-grpc-loop", daemon=True)
        self._thread.start()
        try:
            # Predicts not queued for a batch: inline when quick and unbatched, else in threads of their own.
            self.placement = placement or CallPlacement(workers, "tfservo-grpc-call", inline=not batched,
                                                        max_queued=max_queued)
            # grpc.aio hands the loop one call at a time, so calls cannot be gathered on it: under
            # load each would be a batch of one on the loop, one at a time.
            self.queue = QueuedCalls(api, batched=batched, gather=False)
            self._server: grpc.aio.Server = self._on_loop(self._create(
                # the callers' keys checked (--api-keys); each call's span is GrpcCalls'
                interceptors=list(interceptors),
                options=[
                    ("grpc.max_receive_message_length", max_message_bytes),
                    ("grpc.max_send_message_length", -1),
                    # Off unless several worker processes share the port: a second server on a
                    # taken port must fail rather than silently take half the traffic.
                    ("grpc.so_reuseport", 1 if reuse_port else 0),
                    *options,
                ],
            ))
            prediction = PredictionServicer(api, self.placement, self.queue, scope, max(MAX_FILL_BYTES, max_message_bytes))
            self.add_service(service_handler(PREDICTION_SERVICE, prediction, PREDICTION_METHODS, taps=taps))
            self.add_service(service_handler(MODEL_SERVICE, ModelServicer(api, scope, reload_config), MODEL_METHODS, gate))
            from grpc_health.v1 import health_pb2_grpc

            from tfservo.grpc.health import HealthService

            self.health = HealthService(api.manager, draining)
            self._on_loop(_call(health_pb2_grpc.add_HealthServicer_to_server, self.health, self._server))
            self.host = host
            self.port = 0  # port None: on the Unix socket only (a locked loopback server's)
            if port is not None:
                address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                self.port = self._bind(address, credentials)
                if not self.port:
                    raise Unavailable(f"cannot listen for gRPC on {address} (port in use?); pick another --grpc-port")
            if socket_path:  # TF Serving's --grpc_socket_path: the same services on a Unix socket
                self._listen_on_socket(socket_path, credentials)
        except BaseException:  # nothing half-started: the loop's thread ends
            self._close()
            raise
        self._stopped: threading.Event | None = None

    @staticmethod
    async def _create(**kwargs: Any) -> grpc.aio.Server:
        return grpc.aio.server(**kwargs)  # on the loop: the server belongs to the loop it is made on

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _bind(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Listen on `address` (TLS with `credentials`); the bound port, 0 if it cannot."""
        try:
            if credentials is not None:
                return int(self._on_loop(_call(self._server.add_secure_port, address, credentials)))
            return int(self._on_loop(_call(self._server.add_insecure_port, address)))
        except RuntimeError:
            return 0

    def _listen_on_socket(self, path: str, credentials: grpc.ServerCredentials | None) -> None:
        """gRPC replaces a socket file left at `path`; with several workers the last one started
        answers there."""
        address = f"unix:{os.path.abspath(path)}"
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise Unavailable(f"cannot serve gRPC on {address}: {folder} is not a directory; create it or change --grpc_socket_path")
        if not self._bind(address, credentials):
            raise Unavailable(f"cannot serve gRPC on {address}; check the path is writable or change --grpc_socket_path")

    def add_service(self, handler: grpc.GenericRpcHandler) -> None:
        """Serve another service on this port (before `start`): the front door adds V2's."""
        self._on_loop(_call(self._server.add_generic_rpc_handlers, (handler,)))

    def start(self) -> GrpcServer:
        self._on_loop(self._server.start())
        return self

    def stop(self, grace: float | None = 30.0) -> threading.Event:
        """Refuse new calls now; calls in flight get `grace` seconds. Set when all have ended
        (and the loop with them)."""
        if self._stopped is None:
            stopped = self._stopped = threading.Event()

            async def stop() -> None:
                try:
                    await self._server.stop(grace)
                finally:
                    stopped.set()
                    self._close()

            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        return self._stopped

    def _close(self) -> None:
        """End the loop (its thread returns) and the thread pool, without waiting for either."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._threads.shutdown(wait=False)


async def _call(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the loop (grpc.aio's server methods expect to run there)."""
    return fn(*args)


