"""No TensorFlow, Beam or Spark noise on stderr at the default level, in any mode; TFSERVO_TF_LOGS=1
brings TensorFlow's back."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import write_code
from server_process import ServerProcess, run_cli
from transform_jobs import HALF_PLUS_THREE, write

from tfservo.core.logs import setup_logging
from tfservo.core.settings import resolve_settings
from tfservo.server.loopback import open_service

# TF's glog lines, Python-logged TF/absl/Beam records, Beam workers' default-format records
NOISE = re.compile(
    r"^[IWEF]\d{4} \d\d:\d\d|WARNING: All log messages before absl|oneDNN|cuda|"
    r"(INFO|WARNING):(__main__|root|apache_beam)|\b(tensorflow|absl|apache_beam[\w.]*)(:| [A-Z]+ )|"
    r"is deprecated|apitools not found|"
    r"log4j|WARN (Utils|NativeCodeLoader)|Setting default log level|incubator modules",
    re.M,
)


def noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if NOISE.search(line)]


def test_serve_is_quiet() -> None:
    with ServerProcess([str(HALF_PLUS_THREE), "--workers", "2"]) as server:
        with server.client() as client:
            assert client.post("/invocations", content=b"1.0", headers={"Content-Type": "text/csv"}).status_code == 200
    assert noise(server.output) == []
    # The supervisor says once that the server serves (both workers' pids in it), and the access
    # line; its workers' own start and stop lines are DEBUG.
    serving = [line for line in server.lines if "tfservo.server: serving " in line]
    assert len(serving) == 1 and re.search(r"pids \d+, \d+ of 2 workers", serving[0]), server.output
    assert server.output.count("tfservo.audit: access:") == 1, server.output
    for once in ("all workers drained: closing listeners", "tfservo.server: stopped"):
        assert server.output.count(once) == 1, server.output


@pytest.mark.parametrize(
    "runner", [[], ["--runner", "beam"], ["--runner", "beam", "--beam-option", "direct_num_workers=2",
                                           "--beam-option", "direct_running_mode=multi_processing"],
                ["--runner", "spark"]],
    ids=["local", "beam", "beam-multiprocessing", "spark"],
)
def test_transform_and_invoke_are_quiet(tmp_path, runner) -> None:
    write(tmp_path / "in" / "a.csv", "1\n2\n")
    done = run_cli(["transform", str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"),
                    "--content-type", "text/csv", "--split-type", "Line", *runner])
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert noise(stderr) == []
    if not runner:
        done = run_cli(["invoke", str(HALF_PLUS_THREE), "--content-type", "text/csv"], input=b"1.0\n")
        assert done.returncode == 0 and noise(done.stderr.decode()) == []


PIPELINE = """
    import numpy as np
    from tfservo.beam import BundleModelHandler
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference

    with beam.Pipeline() as p:
        _ = (p | beam.Create([np.float32(1.0)]) | RunInference(BundleModelHandler({model!r}))
               | beam.Map(lambda r: print("y", float(r.inference["y"]))))
"""


def test_a_beam_pipeline_is_quiet_unless_asked(tmp_path) -> None:
    script = tmp_path / "pipeline.py"
    script.write_text(textwrap.dedent(PIPELINE.format(model=str(HALF_PLUS_THREE))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "TFSERVO"))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "y 3.5" in done.stdout
    assert noise(done.stderr) == []
    loud = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**env, "TFSERVO_TF_LOGS": "1"})
    assert noise(loud.stderr), "TFSERVO_TF_LOGS=1 shows TensorFlow's own lines again"


class _OwnStream(io.StringIO):
    """A stream its owner closes, as a notebook's or a test runner's stderr."""


def test_in_process_callers_keep_their_log_handlers(tmp_path) -> None:
    """A handler bundle used in-process (notebook, Beam worker, `tfservo invoke` under a test
    runner) starts a loopback server and sets up tfservo's logging; neither may close log
    handlers it does not own (uvicorn's default logging config closes every one)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(HALF_PLUS_THREE, bundle / "half_plus_three")
    write_code(bundle / "code", """
        def handler(data, context):
            return data.read(), "text/csv"
    """)
    stream = _OwnStream()
    theirs = logging.StreamHandler(stream)
    theirs.close = lambda: stream.close()  # type: ignore[method-assign]  # as absl's handler does
    logging.getLogger("their.app").addHandler(theirs)
    try:
        with open_service(resolve_settings(paths=[str(bundle)])) as service:
            assert service.rest_base is not None, "the handler bundle got its loopback endpoints"
            assert service.invoker.invoke(b"1.0", "text/csv").body.strip() == b"1.0"
        setup_logging("warning")
        logging.getLogger("their.app").warning("still here")
        assert not stream.closed and "still here" in stream.getvalue()
    finally:
        logging.getLogger("their.app").removeHandler(theirs)
