"""OpenTelemetry traces from a real `tfservo serve`, received over OTLP by a receiver the test
runs: one trace from a client's traceparent through the handler's own REST call to the model
run, over HTTP and over gRPC; nothing is exported when the OTEL_* variables are unset."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from conftest import SMC, TFS, grpc_predict_request, handler_bundle
from otlp_receiver import Receiver, start_grpc, start_http
from server_process import ServerProcess
from tensorflow_serving.apis import prediction_service_pb2_grpc

SERVER, CLIENT, INTERNAL = 2, 3, 1  # OTLP's span kinds
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER}-01"

# The handler posts to the model over REST itself, as many SageMaker handlers do.
HANDLER = """
    import json
    import requests

    def handler(data, context):
        doc = json.loads(data.read())
        answer = requests.post(context.rest_uri, json={"instances": doc["instances"]}, timeout=30)
        return answer.text, "application/json"
"""

HANDLERS = """
    import json

    def input_handler(data, context):
        return json.dumps({"instances": json.loads(data.read())["values"]})

    def output_handler(response, context):
        return response.content, "application/json"
"""


def otel_env(endpoint: str, protocol: str = "grpc", *, phases: bool = False) -> dict[str, str]:
    """The variables that trace to the test's receiver; `phases`: the phases' spans too
    (TFSERVO_TRACE_DETAIL=phases), where a test follows decode, encode and the batch."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_SERVICE_NAME": "tfservo-under-test", "OTEL_BSP_SCHEDULE_DELAY": "100",
        **({"TFSERVO_TRACE_DETAIL": "phases"} if phases else {}),
    }


@pytest.fixture(scope="module")
def receiver():
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    yield receiver, endpoint
    server.stop(None)


def in_trace(spans, trace_id):
    return [s for s in spans if s.trace_id == trace_id]


def test_one_trace_from_the_callers_traceparent_through_the_handlers_rest_call(receiver, tmp_path) -> None:
    received, endpoint = receiver
    bundle = handler_bundle(tmp_path, HANDLER)
    with ServerProcess([str(bundle)], env=otel_env(endpoint)) as server:
        answer = httpx.post(f"{server.url}/invocations", json={"instances": [1.0, 2.0]},
                            headers={"traceparent": TRACEPARENT}, timeout=30)
        assert answer.status_code == 200 and answer.json() == {"predictions": [3.5, 4.0]}
        spans = received.wait_for(lambda spans: len({s.name for s in in_trace(spans, TRACE_ID)} & {
            "POST /invocations", "handler", "POST", "POST /v1/models/{name}:predict", "model"}) == 5)
    trace = in_trace(spans, TRACE_ID)
    by_id = {s.span_id: s for s in trace}
    entry = next(s for s in trace if s.name == "POST /invocations")
    assert entry.parent_id == CALLER and entry.kind == SERVER and entry.service == "tfservo-under-test"
    assert entry.attributes["http.route"] == "/invocations" and entry.attributes["http.response.status_code"] == 200
    handler = next(s for s in trace if s.name == "handler")
    assert by_id[handler.parent_id].name == "POST /invocations"
    client = next(s for s in trace if s.kind == CLIENT)
    assert client.parent_id == handler.span_id  # the handler's own requests.post
    inner = next(s for s in trace if s.name == "POST /v1/models/{name}:predict")
    assert inner.parent_id == client.span_id and inner.kind == SERVER
    model = next(s for s in trace if s.name == "model")
    chain = [model]
    while chain[-1].parent_id in by_id:
        chain.append(by_id[chain[-1].parent_id])
    assert [s.name for s in chain][-5:] == [
        [s.name for s in chain][-5], "POST /v1/models/{name}:predict", "POST", "handler", "POST /invocations"]
    assert model.attributes["tfservo.model.name"] == "half_plus_three" and model.attributes["tfservo.model.version"] == 124
    # by default a request's spans are the door's, the model's and the handler's: no phases
    assert {by_id[s].name for s in by_id if by_id[s].parent_id == inner.span_id} == {"model"}


def test_input_and_output_handler_spans_and_batching_over_otlp_http(tmp_path) -> None:
    received = Receiver()
    http_server, endpoint = start_http(received)
    try:
        bundle = handler_bundle(tmp_path, HANDLERS)
        with ServerProcess([str(bundle), "--enable-batching"], env=otel_env(endpoint, "http/protobuf", phases=True)) as server:
            answer = httpx.post(f"{server.url}/invocations", json={"values": [1.0]},
                                headers={"traceparent": TRACEPARENT}, timeout=30)
            assert answer.json() == {"predictions": [3.5]}
            # every span the assertions below read (the server span ends last, and may come in a later batch)
            spans = received.wait_for(lambda spans: {"POST /invocations", "input_handler", "output_handler", "model",
                                                     "batch.queue", "batch.run"} <= {
                s.name for s in in_trace(spans, TRACE_ID)})
            below = server.descendants()  # its worker, and the worker's span exporter process
            assert len(below) >= 2, below
    finally:
        http_server.shutdown()
    deadline = time.monotonic() + 30  # the exporter ends with its worker, the worker with the server
    while any(os.path.exists(f"/proc/{pid}") for pid in below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in below if os.path.exists(f"/proc/{pid}")]
    trace = in_trace(spans, TRACE_ID)
    by_name = {s.name: s for s in trace}
    entry = by_name["POST /invocations"]
    assert by_name["input_handler"].parent_id == entry.span_id == by_name["output_handler"].parent_id
    assert by_name["input_handler"].end_ns <= by_name["model"].start_ns <= by_name["output_handler"].start_ns
    queued, run = by_name["batch.queue"], by_name["batch.run"]
    assert queued.parent_id == run.parent_id == by_name["model"].span_id
    assert queued.end_ns == run.start_ns and run.attributes["tfservo.batch.size"] == 1


def test_grpc_predict_continues_the_callers_trace(receiver) -> None:
    received, endpoint = receiver
    model = TFS / "saved_model_half_plus_two_cpu"
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    with ServerProcess([str(model)], env=otel_env(endpoint)) as server, \
            grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = grpc_predict_request("saved_model_half_plus_two_cpu", np.array([1.0], np.float32))
        stub.Predict(request, metadata=[("traceparent", f"00-{trace_id}-{CALLER}-01")], timeout=30)
        spans = received.wait_for(lambda spans: {"model"} <= {s.name for s in in_trace(spans, trace_id)})
    trace = in_trace(spans, trace_id)
    entry = next(s for s in trace if s.kind == SERVER)
    assert entry.parent_id == CALLER and entry.name == "/tensorflow.serving.PredictionService/Predict"
    assert entry.attributes["rpc.system"] == "grpc"
    assert next(s for s in trace if s.name == "model").parent_id == entry.span_id


def test_spans_past_the_export_queue_are_dropped_with_a_line_that_counts_them(receiver) -> None:
    """A full export queue drops spans, never silently: a line at the first drop, a metric, and
    a line with the count when the worker stops; the spans that were queued are still exported."""
    received, endpoint = receiver
    trace_id = "5b8aa5a2d2c872e8321cf37308d69df2"
    env = {**otel_env(endpoint, phases=True), "OTEL_BSP_MAX_QUEUE_SIZE": "3", "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    with ServerProcess([str(SMC / "resources" / "models" / "half_plus_three")], env=env) as server:
        for _ in range(3):  # four or more spans each: the first request alone fills the queue
            answer = httpx.post(f"{server.url}/invocations", json={"instances": [1.0]},
                                headers={"traceparent": f"00-{trace_id}-{CALLER}-01"}, timeout=30)
            assert answer.status_code == 200
        server.wait_for("spans dropped")
        first = [line for line in server.output.splitlines() if "spans dropped" in line]
        assert len(first) == 1 and "tracing: spans dropped: 1 (1 since the start); 3 already waited" in first[0]
        assert "OTEL_TRACES_SAMPLER=parentbased_traceidratio" in first[0]
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        counted = float(next(line.split()[-1] for line in metrics.splitlines()
                             if line.startswith("tfservo_trace_spans_dropped_total")))
        assert counted >= 9
        server.stop()
    last = [line for line in server.output.splitlines() if "spans dropped" in line][-1]
    dropped = int(last.split("since the start")[0].rsplit("(", 1)[1])
    assert dropped >= 9 and len(first) == 1 and last != first[0]
    spans = received.wait_for(lambda spans: len(in_trace(spans, trace_id)) >= 3)
    assert len(in_trace(spans, trace_id)) == 3


def test_unset_otel_variables_export_nothing(receiver) -> None:
    received, endpoint = receiver
    before = len(received.spans)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}
    with ServerProcess([str(SMC / "resources" / "models" / "half_plus_three")], env=env) as server:
        httpx.post(f"{server.url}/invocations", json={"instances": [1.0]}, headers={"traceparent": TRACEPARENT})
        assert "tracing on" not in server.output
    assert len(received.spans) == before


def test_an_unknown_exporter_is_refused_at_start() -> None:
    server = ServerProcess([str(TFS / "saved_model_half_plus_two_cpu")], env={"OTEL_TRACES_EXPORTER": "zipkin"},
                           timeout=60)
    with pytest.raises(RuntimeError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        server.start()


# The handler calls the model over gRPC on the channel tfservo gives it, and logs a line.
GRPC_HANDLER = """
    import json
    import logging

    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    def handler(data, context):
        logging.getLogger("my.handler").warning("calling the model over gRPC")
        request = predict_pb2.PredictRequest()
        request.model_spec.name = context.model_name
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(json.loads(data.read())["instances"], np.float32)))
        answer = prediction_service_pb2_grpc.PredictionServiceStub(context.channel).Predict(request, timeout=30)
        return json.dumps({"predictions": tf.make_ndarray(answer.outputs["y"]).tolist()}), "application/json"
"""


def test_a_handlers_grpc_call_on_context_channel_and_its_json_log_line_join_the_trace(receiver, tmp_path) -> None:
    received, endpoint = receiver
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
    bundle = handler_bundle(tmp_path, GRPC_HANDLER)
    with ServerProcess([str(bundle), "--log-format", "json"], env=otel_env(endpoint)) as server:
        answer = httpx.post(f"{server.url}/invocations", json={"instances": [1.0]},
                            headers={"traceparent": f"00-{trace_id}-{CALLER}-01"}, timeout=30)
        assert answer.json() == {"predictions": [3.5]}
        spans = received.wait_for(lambda spans: sum(
            s.kind == SERVER for s in in_trace(spans, trace_id)) == 2 and "model" in {s.name for s in in_trace(spans, trace_id)})
        output = server.output
    trace = in_trace(spans, trace_id)
    handler = next(s for s in trace if s.name == "handler")
    client = next(s for s in trace if s.kind == CLIENT)
    inner = next(s for s in trace if s.name == "/tensorflow.serving.PredictionService/Predict" and s.kind == SERVER)
    assert client.parent_id == handler.span_id and inner.parent_id == client.span_id
    logged = [json.loads(line) for line in output.splitlines() if "calling the model over gRPC" in line]
    assert logged and logged[0]["trace_id"] == trace_id and logged[0]["span_id"] == handler.span_id


def test_a_transform_traces_its_job_objects_and_requests(receiver, tmp_path) -> None:
    received, endpoint = receiver
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("".join(f"{i}.0\n" for i in range(10)))
    (tmp_path / "in" / "b.csv").write_text("1.0\n")
    command = [str(Path(sys.executable).with_name("tfservo")), "transform", str(SMC / "resources" / "models" / "half_plus_three"),
               str(tmp_path / "in"), str(tmp_path / "out"), "--content-type", "text/csv", "--split-type", "Line",
               "--assemble-with", "Line", "--max-payload", "0.00002", "--progress", "none"]
    done = subprocess.run(command, env={**os.environ, **otel_env(endpoint)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    spans = received.wait_for(lambda spans: any(s.name == "transform" for s in spans))
    job = next(s for s in spans if s.name == "transform")
    trace = in_trace(spans, job.trace_id)
    objects = {s.attributes["tfservo.transform.object"]: s for s in trace if s.name == "object"}
    assert sorted(objects) == ["a.csv", "b.csv"] and all(o.parent_id == job.span_id for o in objects.values())
    requests = [s for s in trace if s.name == "request"]
    assert sorted((r.attributes["tfservo.transform.object"], r.parent_id) for r in requests) == sorted([
        ("a.csv", objects["a.csv"].span_id), ("a.csv", objects["a.csv"].span_id), ("b.csv", objects["b.csv"].span_id)])
    models = [s for s in trace if s.name == "model"]
    assert len(models) == 3 and {m.parent_id for m in models} <= {r.span_id for r in requests}
    assert job.attributes["tfservo.transform.objects_done"] == 2


def test_sampled_and_unsampled_requests_batched_together_keep_to_their_own_traces(receiver) -> None:
    """Requests sent at once on 40 connections, every other one marked not sampled by its caller,
    share the worker's loop batches (adaptive batching; checked: a batch with several callers):
    each sampled trace gets its own decode, model and encode spans, once, and no span of an
    unsampled request lands in anyone's trace."""
    received, endpoint = receiver
    sampled = {f"{i:032x}": i % 2 == 1 for i in range(1, 401)}  # each burst opens with a sampled one
    path = "/v1/models/saved_model_half_plus_two_cpu:predict"
    body = b'{"instances": [1.0]}'

    def burst(server: ServerProcess, trace_ids: list[str | None]) -> None:
        host, port = server.url.removeprefix("http://").split(":")
        sockets = [socket.create_connection((host, int(port)), timeout=30) for _ in trace_ids]
        requests = [
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
            + (f"traceparent: 00-{t}-{CALLER}-{'01' if sampled[t] else '00'}\r\n".encode() if t else b"")
            + b"\r\n" + body
            for t in trace_ids
        ]
        paused = server.descendants()  # the worker (and its export child) stopped while all 40 are sent:
        for pid in paused:  # it then finds every request in one turn of its loop, to batch together
            os.kill(pid, signal.SIGSTOP)
        try:
            for sock, request in zip(sockets, requests):
                sock.sendall(request)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        for sock in sockets:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()

    with ServerProcess([str(TFS / "saved_model_half_plus_two_cpu"), "--workers", "1"],
                       env=otel_env(endpoint, phases=True)) as server:
        for _ in range(3):  # untraced first: the model's batches prove quick, so they gather on the loop
            burst(server, [None] * 40)
        for chunk in range(0, len(sampled), 40):
            burst(server, list(sampled)[chunk : chunk + 40])
        wanted = {t for t, on in sampled.items() if on}
        spans = received.wait_for(lambda spans: wanted <= {s.trace_id for s in spans if s.name == "encode"})
    ours = [s for s in spans if s.trace_id in sampled]
    assert {s.trace_id for s in ours} == wanted
    assert max((s.attributes["tfservo.batch.callers"] for s in ours if s.name == "batch.run"), default=0) > 1
    for trace_id in wanted:
        names = sorted(s.name for s in in_trace(ours, trace_id) if s.name in ("decode", "model", "encode"))
        assert names == ["decode", "encode", "model"], (trace_id, names)


SERVER_SPAN = """
from tfservo.core import tracing
tracing.configure()
for flags in ("01", "00"):
    carrier = {"traceparent": f"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}"}
    with tracing.server_span("POST", carrier, lambda: {"url.path": "/x"}) as span:
        span.update_name(f"POST /x {flags}")
        span.set_attribute("http.response.status_code", 503)
        span.set_status(tracing.error_status("503"))
        with tracing.span("decode"):
            pass
tracing.flush()
"""


@pytest.mark.parametrize(("sampler", "names"), [
    ("parentbased_always_on", ["decode", "POST /x 01"]),  # the caller's 00 is not sampled
    ("always_on", ["decode", "POST /x 01", "decode", "POST /x 00"]),
    ("always_off", []),
    ("parentbased_traceidratio", ["decode", "POST /x 01"]),  # a caller's flag wins over the ratio (0.0)
])
def test_the_server_span_follows_the_sampler_and_the_callers_flag(sampler, names) -> None:
    done = subprocess.run([sys.executable, "-c", SERVER_SPAN], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": sampler,
                               "OTEL_TRACES_SAMPLER_ARG": "0.0"})
    assert done.returncode == 0, done.stderr[-2000:]
    spans = [json.loads(s) for s in done.stdout.replace("}\n{", "}\x00{").split("\x00") if s.strip()]
    assert [s["name"] for s in spans] == names
    for server in (s for s in spans if s["name"].startswith("POST")):
        assert server["kind"] == "SpanKind.SERVER" and server["status"]["status_code"] == "ERROR"
        assert server["context"]["trace_id"] == "0x4bf92f3577b34da6a3ce929d0e0e4736"
        assert server["parent_id"] == "0x00f067aa0ba902b7" and server["attributes"]["http.response.status_code"] == 503


ROOTS = """
import json, sys
from tfservo.core import tracing
tracing.configure()
for _ in range(400):  # no traceparent: new traces, sampled by their ids at the ratio
    with tracing.server_span("POST", {}, lambda: {"url.path": "/x"}):
        with tracing.span("decode"):
            pass
tracing.flush()
"""


def test_new_traces_are_sampled_at_the_samplers_ratio() -> None:
    done = subprocess.run([sys.executable, "-c", ROOTS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio",
                               "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert done.returncode == 0, done.stderr[-2000:]
    spans = [json.loads(s) for s in done.stdout.replace("}\n{", "}\x00{").split("\x00") if s.strip()]
    servers = [s for s in spans if s["name"] == "POST"]
    decodes = [s for s in spans if s["name"] == "decode"]
    assert 60 <= len(servers) <= 140, len(servers)  # 100 expected; 4.7 standard deviations either side
    assert sorted(d["parent_id"] for d in decodes) == sorted(s["context"]["span_id"] for s in servers)


def test_every_inference_door_makes_the_same_spans(receiver) -> None:
    """TF Serving REST, V2 REST, TF Serving gRPC and V2 gRPC: each request continues its caller's
    trace with one server span and the same phases under it (decode, the model's batch, encode),
    made where every door's call is queued (service.queued_calls)."""
    import tritonclient.grpc as triton

    received, endpoint = receiver
    model = TFS / "saved_model_half_plus_two_cpu"
    name = "saved_model_half_plus_two_cpu"
    traces = {door: f"d00{i + 1:029x}" for i, door in enumerate(("tfs rest", "v2 rest", "tfs grpc", "v2 grpc"))}  # no other test's ids

    def parent(door: str) -> str:
        return f"00-{traces[door]}-{CALLER}-01"

    with ServerProcess([str(model)], env=otel_env(endpoint, phases=True)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post(f"/v1/models/{name}:predict", json={"instances": [1.0]},
                             headers={"traceparent": parent("tfs rest")}).status_code == 200
            assert http.post(f"/v2/models/{name}/infer", headers={"traceparent": parent("v2 rest")}, json={
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).status_code == 200
        with grpc.insecure_channel(server.grpc_target) as channel:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                grpc_predict_request(name, np.array([1.0], np.float32)), metadata=[("traceparent", parent("tfs grpc"))],
                timeout=30)
        client = triton.InferenceServerClient(server.grpc_target)
        x = triton.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], np.float32))
        client.infer(name, [x], headers={"traceparent": parent("v2 grpc")})
        client.close()
        spans = received.wait_for(lambda spans: all(
            {"decode", "model", "encode"} <= {s.name for s in in_trace(spans, t)} for t in traces.values()))
    phases = {}
    for door, trace_id in traces.items():
        trace = in_trace(spans, trace_id)
        (entry,) = [s for s in trace if s.kind == SERVER]
        assert entry.parent_id == CALLER, door
        # batch.queue / batch.run come only when the call waited for a batch (a lone one runs at once)
        phases[door] = sorted(s.name for s in trace if s.kind != SERVER and not s.name.startswith("batch."))
    assert all(names == ["decode", "encode", "model"] for names in phases.values()), phases


UNSAMPLED = """
import asyncio, json, sys
import httpx
from opentelemetry import trace as api
from opentelemetry.sdk import trace as sdk

made = {"span objects": 0, "span contexts": 0}
def counting(cls, key):
    original = cls.__init__
    def init(self, *args, **kwargs):
        made[key] += 1
        original(self, *args, **kwargs)
    cls.__init__ = init
counting(sdk.ReadableSpan, "span objects")       # every SDK span (sdk.Span is one) and every span of ours
counting(api.NonRecordingSpan, "span objects")   # what an unsampled SDK span, or a context of ours, would be
original_new = api.SpanContext.__new__
def new(cls, *args, **kwargs):
    made["span contexts"] += 1
    return original_new(cls, *args, **kwargs)
api.SpanContext.__new__ = new

class Counter(sdk.SpanProcessor):  # the SDK's own hooks: any span the SDK starts or ends passes here
    started = ended = 0
    def on_start(self, span, parent_context=None): Counter.started += 1
    def on_end(self, span): Counter.ended += 1

from tfservo.core import tracing
from tfservo.core.settings import resolve_settings
from tfservo.http.app import build_app
from tfservo.service.runtime import build_runtime

assert tracing.configure()
api.get_tracer_provider().add_span_processor(Counter())
runtime = build_runtime(resolve_settings(paths=[sys.argv[1]], env={}), 8080)
app = build_app(runtime)

async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tfservo") as client:
        for _ in range(3):  # warm: the first calls build what every later one shares
            await client.post("/invocations", json={"instances": [1.0]})
        before = dict(made)
        for _ in range(50):
            got = await client.post("/invocations", json={"instances": [1.0]})
            assert got.status_code == 200, got.text
        unsampled = {key: made[key] - before[key] for key in made}
        got = await client.post("/invocations", json={"instances": [1.0]},
                                headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        assert got.status_code == 200
    print(json.dumps({"unsampled": unsampled, "sdk_started": Counter.started, "sdk_ended": Counter.ended}),
          file=sys.stderr)

asyncio.run(main())
tracing.flush()
runtime.close()
runtime.service.close()
"""


def test_an_unsampled_request_makes_no_span_and_a_sampled_child_keeps_its_parent() -> None:
    """Fifty requests the sampler (ratio 0) does not sample create no span object, span context
    or SDK span (counted through the SDK's classes and its span-processor hooks); a request with
    a sampled traceparent is still exported, as the caller's child, with the model's span under it."""
    done = subprocess.run(
        [sys.executable, "-c", UNSAMPLED, str(SMC / "resources" / "models" / "half_plus_three")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
             "OTEL_TRACES_SAMPLER_ARG": "0.0"})
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(next(line for line in done.stderr.splitlines() if line.startswith('{"unsampled"')))
    assert counts["unsampled"] == {"span objects": 0, "span contexts": 0}, counts
    assert counts["sdk_started"] == 0  # not one SDK span either, sampled or not: ours are recorded directly
    decoder = json.JSONDecoder()
    spans, text = [], done.stdout
    while text.strip():
        span, end = decoder.raw_decode(text.strip())
        spans.append(span)
        text = text.strip()[end:]
    server = next(s for s in spans if s["kind"] == "SpanKind.SERVER")
    assert server["context"]["trace_id"] == f"0x{TRACE_ID}" and server["parent_id"] == f"0x{CALLER}"
    model = next(s for s in spans if s["name"] == "model")
    assert model["parent_id"] == server["context"]["span_id"]
    assert len(spans) == 2, [s["name"] for s in spans]  # the default: the door's span and the model's
