"""Triton's system shared-memory extension with tritonclient's own shared-memory module, over
REST and gRPC, on the models Triton's examples call (built by examples/triton/build_models.py):
inputs read from and outputs written to registered regions; registrations shared by a server's
workers; a region never lets a caller reach past it (offsets, sizes, truncation, links, other
objects); callers not on this host refused; CUDA's extension refused; off means off."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest
from conftest import REPO
from server_process import ServerProcess

BYTES = 64  # one [1, 16] INT32 tensor


@pytest.fixture(scope="module")
def triton_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton") / "models"
    subprocess.run([sys.executable, str(REPO / "examples" / "triton" / "build_models.py"), str(root)], check=True,
                   stdout=subprocess.DEVNULL)
    return root


@pytest.fixture(scope="module")
def server(triton_models):
    server = ServerProcess([str(triton_models / "simple"), str(triton_models / "simple_string"), "--workers", "2"]).start()
    yield server
    server.stop()


@pytest.fixture
def regions():
    """tritonclient's shared-memory regions, destroyed after the test."""
    import tritonclient.utils.shared_memory as shm

    made = []

    def create(size: int):
        key = f"/tfservo-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        made.append(handle)
        return key, handle

    yield create
    for handle in made:
        try:
            shm.destroy_shared_memory_region(handle)
        except Exception:  # the test removed it itself
            pass


def clients(server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return (httpclient, httpclient.InferenceServerClient(server.url.removeprefix("http://"))), \
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_target))


def simple_through_shared_memory(module, client, inputs_name: str, outputs_name: str, out_offset: int = 0):
    tensors = []
    for i, name in enumerate(("INPUT0", "INPUT1")):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_shared_memory(inputs_name, BYTES, offset=i * BYTES)
        tensors.append(tensor)
    outputs = []
    for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
        output = module.InferRequestedOutput(name)
        output.set_shared_memory(outputs_name, BYTES, offset=out_offset + i * BYTES)
        outputs.append(output)
    return client.infer("simple", tensors, outputs=outputs)


def test_inputs_and_outputs_through_shared_memory_over_rest_and_grpc(server, regions):
    import tritonclient.utils.shared_memory as shm

    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, np.int32)
    for module, client in clients(server):
        client.unregister_system_shared_memory()
        in_key, in_handle = regions(2 * BYTES)
        out_key, out_handle = regions(2 * BYTES)
        shm.set_shared_memory_region(in_handle, [a, b])
        client.register_system_shared_memory("in", in_key, 2 * BYTES)
        client.register_system_shared_memory("out", out_key, 2 * BYTES)
        result = simple_through_shared_memory(module, client, "in", "out")
        assert result.get_output("OUTPUT0") is not None
        total = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
        difference = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=BYTES)
        assert (total == a + b).all() and (difference == a - b).all()
        status = client.get_system_shared_memory_status(**({"as_json": True} if module.__name__.endswith("grpc") else {}))
        listed = status if isinstance(status, list) else list(status["regions"].values())
        assert {(r["name"], r["key"], int(r["byte_size"])) for r in listed} == {
            ("in", in_key, 2 * BYTES), ("out", out_key, 2 * BYTES)}
        client.unregister_system_shared_memory("in")
        client.unregister_system_shared_memory()
        empty = client.get_system_shared_memory_status(**({"as_json": True} if module.__name__.endswith("grpc") else {}))
        assert not (empty if isinstance(empty, list) else empty.get("regions"))
        client.close()


def test_one_registration_serves_every_worker(server, regions):
    """Registered through one connection, used through fresh ones (which either worker takes)."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    key, handle = regions(4 * BYTES)
    shm.set_shared_memory_region(handle, [np.ones((1, 16), np.int32), np.ones((1, 16), np.int32)])
    first = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    first.register_system_shared_memory("both", key, 4 * BYTES)
    first.close()
    try:
        for _ in range(12):
            client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
            simple_through_shared_memory(httpclient, client, "both", "both", out_offset=2 * BYTES)
            client.close()
            assert (shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=2 * BYTES) == 2).all()
    finally:
        httpclient.InferenceServerClient(server.url.removeprefix("http://")).unregister_system_shared_memory("both")


def test_a_region_never_reaches_past_itself(server, regions, tmp_path):
    import httpx
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    key, handle = regions(2 * BYTES)
    shm.set_shared_memory_region(handle, [np.zeros((2, 16), np.int32)])
    for module, client in clients(server):
        with pytest.raises(InferenceServerException, match="fewer than offset 0"):
            client.register_system_shared_memory("big", key, 4 * BYTES)  # larger than the object
        with pytest.raises(InferenceServerException, match="not a POSIX shared-memory name"):
            client.register_system_shared_memory("up", "/../../etc/passwd", 16)
        with pytest.raises(InferenceServerException, match="no shared-memory object"):
            client.register_system_shared_memory("none", "/tfservo-no-such-region", 16)
        client.register_system_shared_memory("half", key, BYTES, offset=BYTES)  # the second tensor only

        def inputs(size: int, offset: int = 0, module=module) -> list[object]:  # type: ignore[no-untyped-def]
            tensors = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            tensors[0].set_shared_memory("half", size, offset=offset)
            tensors[1].set_shared_memory("half", BYTES)
            return tensors

        with pytest.raises(InferenceServerException, match="run past its 64 registered bytes"):
            client.infer("simple", inputs(BYTES, offset=BYTES))  # offset past the registration's end
        with pytest.raises(InferenceServerException, match="32 bytes for shape"):
            client.infer("simple", inputs(BYTES // 2))  # the size does not fit the shape
        tensors = inputs(BYTES)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("half", BYTES // 2)
        with pytest.raises(InferenceServerException, match="should be at least 64 bytes"):
            client.infer("simple", tensors, outputs=[output])
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("half", key, BYTES)
        client.unregister_system_shared_memory("half")
        client.close()
    link = f"tfservo-test-link-{uuid.uuid4().hex[:8]}"
    os.symlink("/etc/passwd", f"/dev/shm/{link}")
    try:
        got = httpx.post(f"{server.url}/v2/systemsharedmemory/region/link/register",
                         json={"key": f"/{link}", "offset": 0, "byte_size": 16})
        assert got.status_code == 400 and "Unable to open shared memory region" in got.json()["error"]
    finally:
        os.unlink(f"/dev/shm/{link}")
    got = httpx.post(f"{server.url}/v2/systemsharedmemory/region/x/register", json={"key": key, "byte_size": "64"})
    assert got.status_code == 400 and "byte_size must be a non-negative integer" in got.json()["error"]


def test_a_region_shrunk_replaced_or_removed_is_an_error_and_the_server_lives(server, regions):
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    key, handle = regions(2 * BYTES)
    client.register_system_shared_memory("shrinks", key, 2 * BYTES)
    os.truncate(f"/dev/shm{key}", 8)  # what a client that shrinks its region does; mmap would SIGBUS here
    with pytest.raises(InferenceServerException, match="was truncated since it was registered"):
        simple_through_shared_memory(httpclient, client, "shrinks", "shrinks")
    shm.destroy_shared_memory_region(handle)
    with pytest.raises(InferenceServerException, match="no longer exists; it was unregistered"):
        simple_through_shared_memory(httpclient, client, "shrinks", "shrinks")
    assert client.get_system_shared_memory_status() == []
    key, handle = regions(2 * BYTES)
    client.register_system_shared_memory("replaced", key, 2 * BYTES)
    os.unlink(f"/dev/shm{key}")
    with open(f"/dev/shm{key}", "wb") as other:  # another object under the same name
        other.write(bytes(2 * BYTES))
    with pytest.raises(InferenceServerException, match="was replaced by another object"):
        simple_through_shared_memory(httpclient, client, "replaced", "replaced")
    assert client.is_server_live()
    client.close()


def _outside_address() -> str | None:
    """An address of this host that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_caller_off_this_host_cannot_register(triton_models, regions):
    import httpx

    address = _outside_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    server = ServerProcess([str(triton_models / "simple"), "--host", "0.0.0.0", "--management", "off"]).start()
    try:
        key, _ = regions(BYTES)
        port = server.url.rsplit(":", 1)[1]
        got = httpx.post(f"http://{address}:{port}/v2/systemsharedmemory/region/r/register",
                         json={"key": key, "offset": 0, "byte_size": BYTES})
        assert got.status_code == 403 and "only be registered by a client on this host" in got.json()["error"]
        assert httpx.post(f"{server.url}/v2/systemsharedmemory/region/r/register",
                          json={"key": key, "offset": 0, "byte_size": BYTES}).status_code == 200
    finally:
        server.stop()


def test_cuda_is_refused_and_off_means_off(server, triton_models, regions):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    for _, client in clients(server):
        metadata = client.get_server_metadata(**({"as_json": True} if isinstance(client, grpcclient.InferenceServerClient) else {}))
        assert "system_shared_memory" in metadata["extensions"]
        assert not any("cuda" in e for e in metadata["extensions"])
        client.unregister_cuda_shared_memory()  # nothing registered: no error, as Triton's examples expect
        client.close()
    rest = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
        rest.register_cuda_shared_memory("gpu", b"handle", 0, 64)
    off = ServerProcess([str(triton_models / "simple"), "--shared-memory", "off"]).start()
    try:
        client = httpclient.InferenceServerClient(off.url.removeprefix("http://"))
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        key, _ = regions(BYTES)
        with pytest.raises(InferenceServerException, match="shared memory is off on this server"):
            client.register_system_shared_memory("r", key, BYTES)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        tensor.set_shared_memory("r", BYTES)
        other = httpclient.InferInput("INPUT1", [1, 16], "INT32")
        other.set_data_from_numpy(np.zeros((1, 16), np.int32))
        with pytest.raises(InferenceServerException, match="does not take shared memory"):
            client.infer("simple", [tensor, other])
    finally:
        off.stop()
