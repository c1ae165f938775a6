"""RemoteBundleModelHandler against a real `tfservo serve` process over REST and gRPC.

An overloaded endpoint is played by a small HTTP proxy in front of the real server that
answers 503/429 for a number of requests before passing them through.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import apache_beam as beam
import httpx
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.testing.util import assert_that, equal_to
from conftest import TFS
from server_process import ServerProcess

from tfservo.beam import RemoteBundleModelHandler
from tfservo.core.errors import Code, ServingError

HALF_PLUS_TWO = str(TFS / "saved_model_half_plus_two_2_versions")
MODEL = "saved_model_half_plus_two_2_versions"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess([HALF_PLUS_TWO]) as srv:
        yield srv


def example(x: float) -> bytes:
    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[x]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_rest_predict_classify_regress_and_invocations(server: ServerProcess) -> None:
    p = beam.Pipeline()
    keyed = (
        p
        | "keyed" >> beam.Create([("a", np.array([1.0], np.float32)), ("b", np.array([4.0], np.float32))])
        | "predict"
        >> RunInference(
            KeyedModelHandler(
                RemoteBundleModelHandler(server.url, model_name=MODEL, version=123, max_batch_size=8)
            )
        )
        | "predict out" >> beam.MapTuple(lambda k, r: (k, r.inference["y"].tolist(), r.model_id))
    )
    assert_that(
        keyed, equal_to([("a", [2.5], f"{MODEL}/123"), ("b", [4.0], f"{MODEL}/123")]), label="predict"
    )

    logs = (
        p
        | "examples" >> beam.Create([example(2.0), example(6.0)])
        | "classify"
        >> RunInference(
            RemoteBundleModelHandler(
                server.url, model_name=MODEL, signature_name="classify_x_to_y", output="prediction_log"
            )
        )
        | "classify out"
        >> beam.Map(
            lambda log: (
                log.classify_log.request.input.example_list.examples[0]
                .features.feature["x"]
                .float_list.value[0],
                log.classify_log.response.result.classifications[0].classes[0].score,
            )
        )
    )
    assert_that(logs, equal_to([(2.0, 3.0), (6.0, 5.0)]), label="classify")

    regressed = (
        p
        | "features" >> beam.Create([{"x": 10.0}])
        | "regress"
        >> RunInference(
            RemoteBundleModelHandler(server.url, model_name=MODEL, signature_name="regress_x_to_y2")
        )
        | "regress out" >> beam.Map(lambda r: (r.inference, r.model_id))
    )
    assert_that(regressed, equal_to([(8.0, f"{MODEL}/124")]), label="regress")

    invoked = (
        p
        | "bodies" >> beam.Create([b"1.0\n2.0"])
        | "invoke"
        >> RunInference(RemoteBundleModelHandler(server.url, content_type="text/csv", accept="text/csv"))
        | "invoke out" >> beam.Map(lambda r: r.inference)
    )
    assert_that(invoked, equal_to([b"2.5\n3.0\n"]), label="invocations")
    p.run().wait_until_finish()


def test_grpc_predict_classify_regress(server: ServerProcess) -> None:
    assert server.grpc_target, "tfservo serve printed no gRPC address:\n" + server.output
    endpoint = f"grpc://{server.grpc_target}"
    p = beam.Pipeline()
    predicted = (
        p
        | "arrays" >> beam.Create([np.array([2.0], np.float32), np.array([6.0], np.float32)])
        | "predict"
        >> RunInference(RemoteBundleModelHandler(endpoint, model_name=MODEL, output="prediction_log"))
        | "predict out"
        >> beam.Map(
            lambda log: (
                tf.make_ndarray(log.predict_log.request.inputs["x"]).tolist(),
                tf.make_ndarray(log.predict_log.response.outputs["y"]).tolist(),
                log.predict_log.response.model_spec.version.value,
            )
        )
    )
    assert_that(predicted, equal_to([([[2.0]], [[3.0]], 124), ([[6.0]], [[5.0]], 124)]), label="predict")
    classified = (
        p
        | "examples" >> beam.Create([example(4.0)])
        | "classify"
        >> RunInference(
            RemoteBundleModelHandler(endpoint, model_name=MODEL, signature_name="classify_x_to_y")
        )
        | "classify out" >> beam.Map(lambda r: r.inference)
    )
    assert_that(classified, equal_to([[("", 4.0)]]), label="classify")
    regressed = (
        p
        | "features" >> beam.Create([{"x": 2.0}])
        | "regress"
        >> RunInference(
            RemoteBundleModelHandler(endpoint, model_name=MODEL, version=123, signature_name="regress_x_to_y")
        )
        | "regress out" >> beam.Map(lambda r: (r.inference, r.model_id))
    )
    assert_that(regressed, equal_to([(3.0, f"{MODEL}/123")]), label="regress")
    p.run().wait_until_finish()


def test_only_bad_elements_of_a_remote_batch_reach_the_dead_letter_output(server: ServerProcess) -> None:
    xs = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    elements: list = [np.array([x], np.float32) for x in xs]
    elements[5] = "abc"
    p = beam.Pipeline()
    for protocol, endpoint in (("rest", server.url), ("grpc", f"grpc://{server.grpc_target}")):
        handler = RemoteBundleModelHandler(
            endpoint, model_name=MODEL, min_batch_size=8, max_batch_size=8, per_element_failures=True
        )
        main, dlq = (
            p
            | f"{protocol} eight" >> beam.Create(elements)
            | f"{protocol} batch of 8" >> RunInference(handler).with_exception_handling()
        )
        good = main | f"{protocol} out" >> beam.Map(
            lambda r: (float(r.example[0]), float(r.inference["y"][0]))
        )
        assert_that(good, equal_to([(x, 0.5 * x + 2) for x in xs if x != 5.0]), label=f"{protocol} 7 results")
        failed = dlq.failed_inferences | f"{protocol} dlq" >> beam.MapTuple(
            lambda batch, error: (list(batch), error[0].__name__, "1 of 8 elements failed" in error[1],
                                  "element 5 (" in error[1])  # error[1] is repr(error): quotes escaped
        )
        assert_that(failed, equal_to([(["abc"], "ElementErrors", True, True)]), label=f"{protocol} 1 failure")
    p.run().wait_until_finish()


class _Overloaded(http.server.ThreadingHTTPServer):
    """Answers `failures[METHOD]` (status codes, in order) before proxying requests to `upstream`."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.seen = upstream, []
        self.failures: dict[str, list[int]] = {"GET": [], "POST": []}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: _Overloaded

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            failures = self.server.failures[self.command]
            status = failures.pop(0) if failures else None
            self.server.seen.append((self.command, status or 200))
        if status is not None:
            payload = b'{"error": "busy"}'
            self.send_response(status)
            self.send_header("Retry-After", "0")
        else:
            answer = httpx.request(
                self.command,
                self.server.upstream + self.path,
                content=body,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
            )
            payload = answer.content
            self.send_response(answer.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _handle

    def log_message(self, *args) -> None:
        pass


def test_retries_with_back_off_on_503_and_429(server: ServerProcess) -> None:
    proxy = _Overloaded(server.url)
    try:
        # Loading reads the model's metadata: refused twice, then answered.
        proxy.failures["GET"] = [503, 429]
        handler = RemoteBundleModelHandler(
            proxy.url, model_name=MODEL, max_retries=2, initial_backoff_secs=0.01
        )
        model = handler.load_model()
        assert proxy.seen == [("GET", 503), ("GET", 429), ("GET", 200)]
        assert model.target().model_id == f"{MODEL}/124"

        # Inference calls are retried too, and give up with a message that says so.
        proxy.failures["POST"] = [503, 503, 503]
        with pytest.raises(ServingError, match=r"answered 503: busy \(gave up after 3 attempts") as caught:
            handler.run_inference([np.array([4.0], np.float32)], model)
        assert caught.value.code is Code.UNAVAILABLE

        # In a pipeline: one retry, counted in the remote_retries metric.
        proxy.failures["POST"] = [429]
        p = beam.Pipeline()
        out = (
            p
            | beam.Create([np.array([2.0], np.float32)])
            | RunInference(RemoteBundleModelHandler(proxy.url, model_name=MODEL, initial_backoff_secs=0.01))
            | beam.Map(lambda r: r.inference["y"].tolist())
        )
        assert_that(out, equal_to([[3.0]]))
        result = p.run()
        result.wait_until_finish()
        assert proxy.seen[-2:] == [("POST", 429), ("POST", 200)]
    finally:
        proxy.shutdown()
    retries = result.metrics().query(MetricsFilter().with_namespace("tfservo").with_name("remote_retries"))
    assert sum(m.committed for m in retries["counters"]) == 1


def test_remote_errors_name_model_and_endpoint(server: ServerProcess) -> None:
    with pytest.raises(
        ServingError, match=r"GET http://127\.0\.0\.1:\d+/v1/models/nope/metadata answered 404"
    ):
        RemoteBundleModelHandler(server.url, model_name="nope").load_model()
    with pytest.raises(ValueError, match="model_name= is required"):
        RemoteBundleModelHandler(server.url)
    handler = RemoteBundleModelHandler(server.url, model_name=MODEL, signature_name="regress_x_to_y")
    model = handler.load_model()
    with pytest.raises(ServingError, match=r"element 0 \(7\): element 0 is a int; classify and regress take"):
        handler.run_inference([7], model)
