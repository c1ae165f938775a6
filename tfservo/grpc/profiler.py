"""TensorFlow's ProfilerService on the gRPC port, as TF Serving registers it.

`tf.profiler.experimental.client.trace("grpc://HOST:PORT", logdir, ms)` and TensorBoard's
"Capture profile" call `tensorflow.ProfilerService/Profile` on the serving port. TensorFlow's
Python API only starts its profiler server on a port of its own, so the first profiler call
starts it on a free loopback-chosen port and every call is forwarded there as bytes: the traces
are TensorFlow's own, written where the request says (the client's logdir, on this machine).
"""

from __future__ import annotations

import logging
import socket
import threading

import grpc

from tfservo.grpc.methods import SyncContext, threaded

__all__ = ["PROFILER_SERVICE", "profiler_handler"]

log = logging.getLogger("tfservo.server")

PROFILER_SERVICE = "tensorflow.ProfilerService"
_METHODS = ("Profile", "Terminate", "Monitor")


class _Forwarder:
    """Starts TensorFlow's profiler server on first use and forwards calls to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None

    def channel(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                import tensorflow as tf

                port = _free_port()
                tf.profiler.experimental.server.start(port)  # lives as long as the process
                log.info("profiler: TensorFlow's profiler server started on port %d for %s", port, PROFILER_SERVICE)
                self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            return self._channel

    def forward(self, method: str) -> object:
        def call(request: bytes, context: SyncContext) -> bytes:
            remaining = context.time_remaining()
            stub = self.channel().unary_unary(f"/{PROFILER_SERVICE}/{method}")
            try:
                answer: bytes = stub(request, timeout=remaining, wait_for_ready=True)
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or f"{PROFILER_SERVICE}/{method} failed")
            return answer

        return grpc.unary_unary_rpc_method_handler(threaded(call))  # bytes in, bytes out


def profiler_handler() -> grpc.GenericRpcHandler:
    """TensorFlow's ProfilerService (Profile, Terminate, Monitor) for a gRPC server."""
    forwarder = _Forwarder()
    return grpc.method_handlers_generic_handler(
        PROFILER_SERVICE, {method: forwarder.forward(method) for method in _METHODS}
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
