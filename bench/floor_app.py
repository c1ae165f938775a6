"""The transport floor: a do-nothing ASGI app on the HTTP stack tfservo serves with (uvicorn on
uvloop, httptools), reading each request body and answering a fixed body the size of the real
answer. Whatever a server does beyond this is its own cost; "× floor" in the report divides by it.

Usage: python floor_app.py PORT ANSWERS.json [--tfservo-protocol | --granian]

ANSWERS.json maps each POST path to the text answered there. --tfservo-protocol serves through
tfservo's own protocol class (its header and body time limits and connection cap), so the
report can tell the protocol layer's cost from the rest. --granian serves the same app on
granian (a Rust HTTP server for ASGI apps; run with bench/.venv-tools' Python), the candidate
stack that issue 28 asked to be measured against uvicorn.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

_JSON = [(b"content-type", b"application/json")]


def make_app(answers: dict[str, bytes]) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        body = answers.get(scope["path"], b"{}") if scope["method"] == "POST" else b"{}"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def _answers(path: str) -> dict[str, bytes]:
    return {p: text.encode() for p, text in json.loads(open(path).read()).items()}


def from_env() -> Any:
    """The app for granian's worker process (a factory: granian imports its target by name)."""
    return make_app(_answers(os.environ["FLOOR_ANSWERS"]))


def main() -> None:
    port, answers_file = int(sys.argv[1]), sys.argv[2]
    if "--granian" in sys.argv[3:]:
        from granian import Granian

        os.environ["FLOOR_ANSWERS"] = answers_file
        # One worker, its Python on one uvloop thread, as tfservo's one worker on uvicorn;
        # "asginl": ASGI without lifespan (the app has none).
        Granian("floor_app:from_env", address="127.0.0.1", port=port, interface="asginl", workers=1,
                runtime_mode="st", loop="uvloop", factory=True, log_level="warning",
                working_dir=Path(__file__).resolve().parent).serve()
        return
    import uvicorn

    answers = _answers(answers_file)
    http: Any = "httptools"
    if "--tfservo-protocol" in sys.argv[3:]:
        from tfservo.http.protocol import default_max_connections, protocol_class

        http = protocol_class(header_timeout=60, max_connections=default_max_connections())
    uvicorn.run(make_app(answers), host="127.0.0.1", port=port, loop="uvloop", http=http, ws="none",
                lifespan="off", access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
