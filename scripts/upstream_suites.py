"""Run TF Serving's and the SageMaker TF Serving container's own test suites, and Triton's Python
client examples, unmodified, against tfservo: only the server start is swapped.

    scripts/upstream-suites tf-serving SRC [TEST_NAME...]
        SRC: a checkout of github.com/tensorflow/serving. Its
        tensorflow_serving/model_servers/tensorflow_model_server_test.py runs with TEST_SRCDIR
        pointing at a tree where model_servers/tensorflow_model_server is tfservo's and
        servables/tensorflow/testdata is the checkout's own.
    scripts/upstream-suites sagemaker-container SRC [PYTEST_ARGS...]
        SRC: a checkout of github.com/aws/sagemaker-tensorflow-serving-container. Its
        test/integration/local tests run against the tfservo image (scripts/build-image
        tfservo:upstream, built if missing) in place of theirs: `docker run IMAGE serve`.
    scripts/upstream-suites triton-client SRC [EXAMPLE...]
        SRC: a checkout of github.com/triton-inference-server/client. Each of its
        src/python/examples that needs no GPU, image dataset, sequence batching or decoupled model
        runs as it is (plus the compression variants) against `tfservo serve` on Triton's default
        ports 8000 (HTTP) and 8001 (gRPC), with the models they call built from code
        (examples/triton/build_models.py); the model-control examples against multi-model servers.

Exits with the suite's status. What is expected not to pass is listed in EXPECTED_FAILURES
with the reason, and docs/compatibility.md says the same.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"

# Tests that cannot pass here, and why (the rest must pass).
EXPECTED_FAILURES = {
    "TensorflowModelServerTest.test_tf_text": "needs TensorFlow Text's ops and its model, which the "
    "checkout stores in Git LFS; not part of TensorFlow",
}
CONTAINER_TESTS = [
    "test/integration/local/test_container.py",
    "test/integration/local/test_pre_post_processing.py",
    "test/integration/local/test_multi_model_endpoint.py",
    "test/integration/local/test_pre_post_processing_mme.py",
    "test/integration/local/test_multi_tfs.py",
]
# The container's tests that read its nginx config and TF Serving's own start-up log lines (they
# wait for "started nginx" / "Entering the event loop" forever): about their processes, not the API.
NOT_RUN = {
    "test/integration/local/test_nginx_config.py": "asserts nginx's rendered config lines in its log",
    "test/integration/local/test_tfs_batching.py": "asserts TF Serving's start-up log lines "
    "(batching parameters as text protos, 'Entering the event loop')",
}

# The container's tests that fail here and why: tfservo's choices where the container is at fault,
# and what this machine lacks (checked against the failures' names; anything else fails the run).
CONTAINER_EXPECTED = {
    "test/integration/local/test_multi_model_endpoint.py::test_bad_model_reqeust": "a load request "
    "without 'url' is the client's mistake: 400 naming the field, where the container answers 500",
    "test/integration/local/test_multi_model_endpoint.py::test_load_one_model_two_times": "needs "
    "test/resources/mme/cifar's variables file, which the copy of the checkout run here lacks",
    "test/integration/local/test_pre_post_processing.py::*[[]4]": "the handler asserts Pillow is not "
    "importable, but tfservo's TensorFlow (Keras) and matplotlib bring Pillow into the server",
    "test/integration/local/test_pre_post_processing.py::*[[]5]": "the same handler: Pillow is there",
}

# Triton's examples that cannot apply here, and why; every other example must pass.
TRITON_NOT_RUN = {
    "grpc_client.py": "calls densenet_onnx, an ONNX image model (tfservo serves TensorFlow)",
    "grpc_image_client.py": "an image-classification client: needs an image model and image files",
    "image_client.py": "an image-classification client: needs an image model and image files",
    "ensemble_image_client.py": "needs Triton's ensemble scheduler and an image model",
    "simple_grpc_cudashm_client.py": "CUDA shared memory: no GPU (tfservo answers 501 / UNIMPLEMENTED)",
    "simple_http_cudashm_client.py": "CUDA shared memory: no GPU (tfservo answers 501 / UNIMPLEMENTED)",
    "simple_grpc_custom_repeat.py": "needs a decoupled model (repeat_int32: many responses to one request)",
    "simple_grpc_aio_sequence_stream_infer_client.py": "needs Triton's sequence batcher (stateful models)",
    "simple_grpc_sequence_stream_infer_client.py": "needs Triton's sequence batcher (stateful models)",
    "simple_grpc_sequence_sync_infer_client.py": "needs Triton's sequence batcher (stateful models)",
    "simple_http_sequence_sync_infer_client.py": "needs Triton's sequence batcher (stateful models)",
}
# Examples that fail only on a check of Triton's own server name (allowed by the issue).
TRITON_EXPECTED = {
    "simple_http_health_metadata.py": "checks get_server_metadata()['name'] == 'triton' (tfservo's is 'tfservo')",
    "simple_grpc_health_metadata.py": "checks the server metadata's name is 'triton' (tfservo's is 'tfservo')",
}
# More runs of one example: its compression options.
TRITON_VARIANTS = {
    "simple_http_infer_client.py": [[], *(["--request-compression-algorithm", a, "--response-compression-algorithm", a]
                                         for a in ("gzip", "deflate"))],
    "simple_http_aio_infer_client.py": [[], *(["--request-compression-algorithm", a,
                                               "--response-compression-algorithm", a] for a in ("gzip", "deflate"))],
    "simple_grpc_infer_client.py": [[], ["-C", "gzip"], ["-C", "deflate"]],
    "simple_grpc_aio_infer_client.py": [[], ["-C", "gzip"], ["-C", "deflate"]],
    "memory_growth_test.py": [["-i", "http"], ["-i", "grpc"]],
}
# The model-control examples load and unload models: each gets a multi-model server whose root
# holds as many models as the example counts in Triton's repository (7 over HTTP, 8 over gRPC).
TRITON_MODEL_CONTROL = {"simple_http_model_control.py": ("http", 7), "simple_grpc_model_control.py": ("grpc", 8)}

# TF Serving runs its Keras tests with Keras 2 (tf_keras); installed beside the suite only.
_RUNNER = """
import runpy, sys
import tensorflow_serving
src = sys.argv[1]
tensorflow_serving.__path__.append(f"{src}/tensorflow_serving")  # its test_util beside the pip package
sys.argv = [f"{src}/tensorflow_serving/model_servers/tensorflow_model_server_test.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def tf_serving(src: Path, tests: list[str]) -> int:
    test = src / "tensorflow_serving" / "model_servers" / "tensorflow_model_server_test.py"
    if not test.is_file():
        sys.exit(f"upstream-suites: {test} not found; give a checkout of github.com/tensorflow/serving")
    work = Path(tempfile.mkdtemp(prefix="tfservo-upstream-tfs-"))
    tree = work / "srcdir" / "tf_serving" / "tensorflow_serving"
    (tree / "model_servers").mkdir(parents=True)
    (tree / "servables").symlink_to(src / "tensorflow_serving" / "servables")
    (tree / "model_servers" / "tensorflow_model_server").symlink_to(REPO / ".venv" / "bin" / "tensorflow_model_server")
    keras2 = work / "keras2"
    tf_version = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('tensorflow'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    minor = ".".join(tf_version.split(".")[:2])
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "uv"), "pip", "install", "--quiet", "--python", str(PYTHON),
         "--target", str(keras2), "--no-deps", f"tf-keras=={minor}.*"],
        check=True,
    )
    (work / "tmp").mkdir()
    env = {
        **os.environ,
        "TEST_SRCDIR": str(work / "srcdir"),
        "TF_USE_LEGACY_KERAS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(keras2), os.environ.get("PYTHONPATH")])),
    }
    print(f"upstream-suites: TF Serving's suite from {src} against {tree / 'model_servers'}; expected to fail: "
          + "; ".join(f"{name} ({why})" for name, why in EXPECTED_FAILURES.items()), flush=True)
    done = subprocess.run(
        [str(PYTHON), "-c", _RUNNER, str(src), f"--test_tmpdir={work / 'tmp'}", *tests], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    sys.stdout.write(done.stdout)
    failed = {line.split()[-1] for line in done.stdout.splitlines() if line.startswith("[  FAILED  ]")}
    unexpected = sorted(failed - set(EXPECTED_FAILURES))
    if unexpected:
        print(f"upstream-suites: unexpected failures: {', '.join(unexpected)}")
        return 1
    print(f"upstream-suites: TF Serving's suite passed except the expected {', '.join(sorted(failed)) or 'none'}")
    return 0


def sagemaker_container(src: Path, args: list[str]) -> int:
    if not (src / "test" / "integration" / "local" / "test_container.py").is_file():
        sys.exit(f"upstream-suites: {src}/test/integration/local not found; give a checkout of "
                 "github.com/aws/sagemaker-tensorflow-serving-container")
    image = "tfservo:upstream"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        subprocess.run([str(REPO / "scripts" / "build-image"), image], check=True)
    print("upstream-suites: the SageMaker container's local tests against", image, "; not run: "
          + "; ".join(f"{name} ({why})" for name, why in NOT_RUN.items()), flush=True)
    done = subprocess.run(
        [str(PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", *(args or CONTAINER_TESTS),
         "--docker-base-name", "tfservo", "--tag", "upstream", "--framework-version", "2"],
        cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    sys.stdout.write(done.stdout)
    failed = {line.split()[1] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))}
    explained = {test: why for test in failed for pattern, why in CONTAINER_EXPECTED.items() if fnmatch(test, pattern)}
    for test, why in sorted(explained.items()):
        print(f"upstream-suites: expected: {test}: {why}")
    unexpected = sorted(failed - set(explained))
    if unexpected or done.returncode not in (0, 1):
        print(f"upstream-suites: unexpected failures: {', '.join(unexpected) or done.returncode}")
        return 1
    print("upstream-suites: the SageMaker container's suite passed except the expected failures above")
    return 0


class _Server:
    """`tfservo serve ARGS...` in the background until `stop()`; ready when /v2/health/ready is 200."""

    def __init__(self, args: list[str], http_port: int, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "tfservo"), "serve", *args], stdout=log.open("wb"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"upstream-suites: tfservo serve {' '.join(args)} exited; its log: {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        sys.exit(f"upstream-suites: tfservo serve {' '.join(args)} was not ready in 180 s; its log: {log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def triton_client(src: Path, chosen: list[str]) -> int:
    examples = src / "src" / "python" / "examples"
    if not (examples / "simple_http_infer_client.py").is_file():
        sys.exit(f"upstream-suites: {examples} not found; give a checkout of github.com/triton-inference-server/client")
    for port in (8000, 8001, 8010, 8011, 8020, 8021):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                sys.exit(f"upstream-suites: port {port} is taken; Triton's examples call 8000 and 8001 (stop what "
                         "listens there)")
    work = Path(tempfile.mkdtemp(prefix="tfservo-upstream-triton-"))
    every, seven = work / "models", work / "models7"
    subprocess.run([str(PYTHON), str(REPO / "examples" / "triton" / "build_models.py"), str(every)], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.copytree(every, seven, ignore=lambda folder, names: ["simple_int64"] if Path(folder) == every else [])
    names = sorted(p.name for p in examples.glob("*.py") if not chosen or p.name in chosen)
    print("upstream-suites: Triton's Python client examples from", examples, "; not run: "
          + "; ".join(f"{name} ({why})" for name, why in TRITON_NOT_RUN.items()), flush=True)
    servers = [_Server([str(every), "--port", "8000", "--grpc-port", "8001"], 8000, work / "serve.log")]
    control = {"http": _Server(["--multi-model", "--model-root", str(seven), "--port", "8020", "--grpc-port", "8021"],
                               8020, work / "control-http.log"),
               "grpc": _Server(["--multi-model", "--model-root", str(every), "--port", "8010", "--grpc-port", "8011"],
                               8010, work / "control-grpc.log")}
    servers += control.values()
    passed, failed, expected = [], [], []
    try:
        for name in names:
            if name in TRITON_NOT_RUN:
                continue
            for extra in TRITON_VARIANTS.get(name, [[]]):
                if name in TRITON_MODEL_CONTROL:
                    extra = ["-u", {"http": "localhost:8020", "grpc": "localhost:8011"}[TRITON_MODEL_CONTROL[name][0]]]
                run = " ".join([name, *extra])
                done = subprocess.run([str(PYTHON), str(examples / name), *extra], cwd=examples, capture_output=True,
                                      text=True, timeout=300)
                if done.returncode == 0:
                    passed.append(run)
                elif name in TRITON_EXPECTED:
                    expected.append(f"{run}: {TRITON_EXPECTED[name]}")
                else:
                    failed.append(run)
                    print(f"upstream-suites: FAILED {run} (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    finally:
        for server in servers:
            server.stop()
    for run in passed:
        print(f"upstream-suites: passed {run}")
    for line in expected:
        print(f"upstream-suites: expected: {line}")
    if failed:
        print(f"upstream-suites: unexpected failures: {', '.join(failed)} (servers' logs under {work})")
        return 1
    print(f"upstream-suites: Triton's examples: {len(passed)} runs passed, {len(expected)} failed as expected")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("tf-serving", "sagemaker-container", "triton-client"):
        print(__doc__)
        return 2
    src = Path(argv[1]).resolve()
    if argv[0] == "tf-serving":
        return tf_serving(src, argv[2:])
    if argv[0] == "triton-client":
        return triton_client(src, argv[2:])
    return sagemaker_container(src, argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
