"""gRPC's connection limits on a real server: a connection that never speaks HTTP/2 is closed
after the header timeout, an idle one is told to go away (and its channel reconnects), and
the stream limit reaches clients in the server's HTTP/2 settings."""

from __future__ import annotations

import socket
import struct
import time

import grpc
import numpy as np
import pytest
from conftest import TFS, grpc_predict_request
from server_process import ServerProcess
from tensorflow_serving.apis import prediction_service_pb2_grpc

MODEL = TFS / "saved_model_half_plus_two_cpu"
_SETTINGS_FRAME, _MAX_CONCURRENT_STREAMS = 4, 3


@pytest.fixture(scope="module")
def server():
    args = [str(MODEL), "--header-timeout", "1", "--grpc-max-connection-idle", "1",
            "--grpc-max-concurrent-streams", "7", "--grpc-channel-arguments", "grpc.max_concurrent_streams=3"]
    with ServerProcess(args) as proc:
        yield proc


def _server_settings(sock: socket.socket) -> dict[int, int]:
    """The HTTP/2 SETTINGS the server sends first on a new connection."""
    data = b""
    while len(data) < 9 or len(data) < 9 + int.from_bytes(data[:3], "big"):
        chunk = sock.recv(4096)
        assert chunk, "closed before its settings"
        data += chunk
    length, kind = int.from_bytes(data[:3], "big"), data[3]
    assert kind == _SETTINGS_FRAME
    return dict(struct.unpack_from(">HI", data, 9 + i) for i in range(0, length, 6))


def test_a_silent_connection_is_closed_after_the_header_timeout(server) -> None:
    host, port = server.grpc_target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        settings = _server_settings(sock)
        assert settings[_MAX_CONCURRENT_STREAMS] == 3  # --grpc-channel-arguments wins over the flag
        while sock.recv(4096):  # GOAWAY, then the close
            pass
        assert time.monotonic() - started < 8


def test_an_idle_connection_is_told_to_go_away_and_the_channel_reconnects(server) -> None:
    states: list[grpc.ChannelConnectivity] = []
    request = grpc_predict_request("saved_model_half_plus_two_cpu", np.array([2.0], np.float32))
    with grpc.insecure_channel(server.grpc_target) as channel:
        channel.subscribe(states.append, try_to_connect=True)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert list(stub.Predict(request, timeout=10).outputs["y"].float_val) == [3.0]
        deadline = time.monotonic() + 10
        while states[-1] != grpc.ChannelConnectivity.IDLE and time.monotonic() < deadline:
            time.sleep(0.1)
        assert grpc.ChannelConnectivity.READY in states and states[-1] == grpc.ChannelConnectivity.IDLE
        assert list(stub.Predict(request, timeout=10).outputs["y"].float_val) == [3.0]


def test_malformed_channel_arguments_stop_the_server_with_a_clear_error() -> None:
    proc = ServerProcess([str(MODEL), "--grpc-channel-arguments", "grpc.max_connection_age_ms"])
    with pytest.raises(RuntimeError) as caught:
        proc.start()
    assert "is not NAME=VALUE" in str(caught.value)
