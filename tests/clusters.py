"""Real local clusters for the engine and adapter tests, started once per test module:
a Ray cluster with two raylets (one CPU each), and a Spark standalone master with two workers
(one core each) from the pyspark package's own bin/spark-class. Torn down by process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def image_example():
    """examples/build_image_example.py, imported (the tiny b64-handler image bundle)."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import build_image_example
    finally:
        sys.path.remove(str(REPO / "examples"))
    return build_image_example


@contextmanager
def ray_cluster() -> Iterator[str]:
    """Two raylets on loopback, this process connected as the driver; yields the address."""
    import ray
    from ray.cluster_utils import Cluster

    # Ray waits a fixed 30 s for a raylet to register; on a 2-core machine busy with the other
    # test worker's servers that is sometimes too short (twice in a row seen once): two more
    # tries, a few seconds apart, before failing.
    for attempt in (1, 2, 3):
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            break
        except Exception as exc:
            if cluster is not None:
                cluster.shutdown()
            if attempt == 3 or "timed out during startup" not in str(exc):
                raise
            time.sleep(5)
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def spark_standalone(tmp: Path) -> Iterator[str]:
    """A standalone master and two one-core workers on loopback; yields spark://host:port."""
    import pyspark

    home = Path(pyspark.__file__).parent
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(tmp / "work"), "SPARK_LOG_DIR": str(tmp / "logs")}
    spark_class = str(home / "bin" / "spark-class")
    procs = []

    def start(*args: str, log: str) -> None:
        out = open(tmp / log, "wb")
        procs.append(subprocess.Popen([spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
          "--webui-port", str(_free_port()), log="master.log")
    try:
        _wait_for_port(port, tmp / "master.log")
        for i in range(2):
            start("org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "2g",
                  "--webui-port", str(_free_port()), "--host", "127.0.0.1", master, log=f"worker{i}.log")
        _wait_for_lines(tmp, ["worker0.log", "worker1.log"], "Successfully registered with master")
        yield master
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_for_port(port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the Spark master did not listen on {port}: {log.read_text()[-2000:]}")


def _wait_for_lines(folder: Path, logs: list[str], line: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(line in (folder / log).read_text(errors="replace") for log in logs):
            return
        time.sleep(0.5)
    tails = {log: (folder / log).read_text(errors="replace")[-1500:] for log in logs}
    raise RuntimeError(f"Spark workers did not register: {tails}")
