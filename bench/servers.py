"""The servers the benchmark starts: tfservo with its defaults and in set configurations, the
three peers, and the transport floor (a do-nothing app on tfservo's HTTP stack).

Each `Server` knows its command line, when it is ready, and where each workload's requests go
(URL path and body file). Every server runs in its own session so that stopping it stops the
whole tree it started (workers, tritonserver, backend stubs).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
TFSERVO = REPO / ".venv" / "bin" / "tfservo"


def peer_python(name: str) -> Path:
    return BENCH / f".venv-{name}" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Endpoint:
    path: str  # URL path the load tool POSTs to
    body: str  # name of the body file under WORK/bodies
    protocol: str  # "tfs" (TF Serving REST / SageMaker) or "v2" (KServe V2, Triton)


@dataclass
class Server:
    """One server configuration to measure."""

    name: str  # e.g. "tfservo batching on, 2 workers"
    family: str  # tfservo | pytriton | kserve | fastapi
    command: list[str]
    ready_path: str
    endpoints: dict[str, Endpoint]  # workload → endpoint
    port: int
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    settings: dict[str, object] = field(default_factory=dict)  # reported with the results
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path, timeout: float = 240.0) -> None:
        """Start the server and wait until its ready URL answers 200."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name.replace(' ', '_').replace(',', '')}.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command,
            cwd=self.cwd,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base_url + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s; see {self.log_path}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's session (its whole process tree), SIGKILL what is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None


def _tfservo_endpoints(model: str) -> dict[str, Endpoint]:
    if model == "resnet":
        return {
            "resnet_b64": Endpoint("/invocations", "resnet_b64.tfs.json", "tfs"),
            "resnet_float": Endpoint("/v1/models/resnet50:predict", "resnet_float.tfs.json", "tfs"),
        }
    return {"mlp": Endpoint("/v1/models/mlp:predict", "mlp.tfs.json", "tfs")}


def tfservo(model: str, bundle: str, *, batching: dict[str, int] | None, workers: int) -> Server:
    """`tfservo serve` on the bundle; batching options go in as SageMaker's environment variables."""
    port = free_port()
    env = {"SAGEMAKER_TFS_ENABLE_BATCHING": "true" if batching else "false"}
    for key, value in (batching or {}).items():
        if key == "eager":
            env["TFSERVO_BATCHING_EAGER"] = "true" if value else "false"
        else:
            env[f"SAGEMAKER_TFS_{key.upper()}"] = str(value)
    mode = ("eager" if batching.get("eager") else "on") if batching else "off"
    name = f"tfservo batching {mode}, {workers} worker{'s' if workers > 1 else ''}"
    return Server(
        name=name,
        family="tfservo",
        command=[
            str(TFSERVO), "serve", bundle, "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", "0", "--workers", str(workers), "--log-level", "warning",
        ],
        ready_path="/ping",
        endpoints=_tfservo_endpoints(model),
        port=port,
        env=env,
        settings={"batching": batching or "off", "workers": workers},
    )


def tfservo_defaults(model: str, bundle: str) -> Server:
    """`tfservo serve` with no batching or worker settings at all: what a new user gets."""
    port = free_port()
    return Server(
        name="tfservo defaults",
        family="tfservo",
        command=[str(TFSERVO), "serve", bundle, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
                 "--log-level", "warning"],
        ready_path="/ping",
        endpoints=_tfservo_endpoints(model),
        port=port,
        env={},
        settings={"batching": "default", "workers": "default"},
    )


_FLOORS = {
    # stack: (row name, family, Python, floor_app.py flags)
    "uvicorn": ("floor: do-nothing app, uvicorn + httptools", "floor", REPO / ".venv", []),
    "tfservo": ("floor: do-nothing app, tfservo's protocol", "floor-protocol", REPO / ".venv", ["--tfservo-protocol"]),
    "granian": ("floor: do-nothing app, granian", "floor-granian", BENCH / ".venv-tools", ["--granian"]),
    "lean": ("floor: do-nothing app, a lean protocol on httptools", "floor-lean", REPO / ".venv", ["--lean"]),
}


def floor_answers(workdir: Path, model: str, reference: list[float]) -> Path:
    """WORKDIR/floor-answers-MODEL.json: what the floor answers at each of tfservo's paths for
    `model`: the in-process reference answer in TF Serving's format, as tfservo answers it."""
    answers = workdir / f"floor-answers-{model}.json"
    answer = json.dumps({"predictions": [reference]})
    answers.write_text(json.dumps({ep.path: answer for ep in _tfservo_endpoints(model).values()}))
    return answers


def floor(model: str, answers: Path, *, stack: str = "uvicorn") -> Server:
    """bench/floor_app.py: the same requests answered by a do-nothing app on an HTTP stack:
    tfservo's (uvicorn + httptools), through tfservo's protocol class, or a candidate (granian, or
    a minimal protocol on httptools: `floor_app.py --lean`)."""
    port = free_port()
    name, family, venv, flags = _FLOORS[stack]
    return Server(
        name=name,
        family=family,
        command=[str(venv / "bin" / "python"), str(BENCH / "floor_app.py"), str(port), str(answers), *flags],
        ready_path="/ping",
        endpoints=_tfservo_endpoints(model),
        port=port,
        settings={"workers": 1},
    )


def least(version_dir: str, *, workers: int = 2) -> Server:
    """bench/least_server.py: the MLP's request with nothing but the work (simdjson, the session
    callable, orjson) on the floor's stack, with as many workers as tfservo's defaults start."""
    port = free_port()
    return Server(
        name="least server: simdjson, session call, orjson",
        family="least",
        command=[str(REPO / ".venv" / "bin" / "python"), str(BENCH / "least_server.py"), str(port), version_dir,
                 str(workers)],
        ready_path="/ping",
        endpoints=_tfservo_endpoints("mlp"),
        port=port,
        settings={"workers": workers},
    )


def pytriton(model: str, version_dir: str, *, max_batch_size: int, queue_delay_micros: int) -> Server:
    python = peer_python("pytriton")
    port, grpc, metrics = free_port(), free_port(), free_port()
    libdir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip() or sysconfig.get_config_var("LIBDIR")
    name = "resnet50" if model == "resnet" else "mlp"
    if model == "resnet":
        endpoints = {
            "resnet_b64": Endpoint(f"/v2/models/{name}_jpeg/infer", "resnet_b64.v2.json", "v2"),
            "resnet_float": Endpoint(f"/v2/models/{name}/infer", "resnet_float.v2.json", "v2"),
        }
    else:
        endpoints = {"mlp": Endpoint(f"/v2/models/{name}/infer", "mlp.v2.json", "v2")}
    return Server(
        name="PyTriton",
        family="pytriton",
        command=[
            str(python), "pytriton_server.py", name, version_dir, str(port), str(grpc), str(metrics),
            str(max_batch_size), str(queue_delay_micros),
        ],
        cwd=str(BENCH / "peers"),
        # Triton's Python backend stub links libpython; without this it may load the system one.
        env={"LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":")},
        # The JPEG model is bound last: when it is ready, both are.
        ready_path=f"/v2/models/{name}_jpeg/ready" if model == "resnet" else f"/v2/models/{name}/ready",
        endpoints=endpoints,
        port=port,
        settings={"dynamic_batcher": {"max_batch_size": max_batch_size, "max_queue_delay_microseconds": queue_delay_micros}},
    )


def _tfs_endpoints(model: str) -> dict[str, Endpoint]:
    if model == "resnet":
        return {
            "resnet_b64": Endpoint("/v1/models/resnet50:predict", "resnet_b64.tfs.json", "tfs"),
            "resnet_float": Endpoint("/v1/models/resnet50:predict", "resnet_float.tfs.json", "tfs"),
        }
    return {"mlp": Endpoint("/v1/models/mlp:predict", "mlp.tfs.json", "tfs")}


def kserve(model: str, version_dir: str) -> Server:
    port = free_port()
    name = "resnet50" if model == "resnet" else "mlp"
    return Server(
        name="KServe",
        family="kserve",
        command=[str(peer_python("kserve")), "kserve_server.py", name, version_dir, str(port), str(free_port())],
        cwd=str(BENCH / "peers"),
        ready_path=f"/v1/models/{name}",
        endpoints=_tfs_endpoints(model),
        port=port,
        settings={"workers": 1},
    )


def fastapi(model: str, version_dir: str) -> Server:
    port = free_port()
    name = "resnet50" if model == "resnet" else "mlp"
    return Server(
        name="FastAPI + TF",
        family="fastapi",
        command=[str(peer_python("fastapi")), "fastapi_server.py", name, version_dir, str(port)],
        cwd=str(BENCH / "peers"),
        ready_path="/health",
        endpoints=_tfs_endpoints(model),
        port=port,
        settings={"workers": 1},
    )
