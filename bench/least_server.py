"""The least a Python server can do for the MLP's request: the floor of doing the work.

One ASGI app on uvicorn + httptools (the floor's stack) whose every POST is parsed by simdjson
into a float64 array, cast to float32, run through a session callable of the SavedModel (one
intra-op thread, ops in the caller's thread: what each of tfservo's workers gets by default) and
answered as {"predictions": ...} by orjson. No batching, metrics, checks, limits or error
answers: it is a measurement, not a server. Beside tfservo's defaults it shows what tfservo's
own layers cost on the way to the model, and beside the do-nothing floor what the work costs.

Usage: python least_server.py PORT VERSION_DIR [WORKERS]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

_MODEL_VAR = "LEAST_SERVER_MODEL"
_JSON = (b"content-type", b"application/json")


def make_app(version_dir: str) -> Any:
    """The app, with the model loaded into a session of its own."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import orjson
    import simdjson
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    from tfservo.models.session_callable import make_session_callable  # the one use of TF's private callable

    config = config_pb2.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=-1)
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=config)
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], version_dir)
    signature = meta.signature_def["serving_default"]
    options = config_pb2.CallableOptions()
    options.feed.append(next(iter(signature.inputs.values())).name)
    options.fetch.append(next(iter(signature.outputs.values())).name)
    call = make_session_callable(session, options)
    parser = simdjson.Parser()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if scope["method"] != "POST":
            answer = b"{}"
        else:
            doc = parser.parse(b"".join(chunks))
            rows = doc["instances"]
            x = np.frombuffer(rows.as_buffer(of_type="d"), dtype=np.float64).reshape(len(rows), -1)
            del rows, doc  # the parser's document goes before the next parse
            answer = b'{"predictions": ' + orjson.dumps(call(x.astype(np.float32))[0], option=orjson.OPT_SERIALIZE_NUMPY) + b"}"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [_JSON, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    return app


def from_env() -> Any:
    """The app for each of uvicorn's worker processes (a factory: uvicorn imports it by name)."""
    return make_app(os.environ[_MODEL_VAR])


def main() -> None:
    import uvicorn

    if len(sys.argv) < 3:
        sys.exit(__doc__)
    port, version_dir = int(sys.argv[1]), sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    os.environ[_MODEL_VAR] = str(Path(version_dir).resolve())
    uvicorn.run("least_server:from_env", factory=True, host="127.0.0.1", port=port, workers=workers,
                loop="uvloop", http="httptools", access_log=False, log_level="warning",
                app_dir=str(Path(__file__).resolve().parent))


if __name__ == "__main__":
    main()
