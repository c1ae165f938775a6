"""GET /async-invocations/{InferenceId}: where one asynchronous request stands (queued, running,
completed, failed, expired), its times and locations — for debugging locally, where SageMaker's
console and CloudWatch are not."""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from tfservo.async_inference.queue import AsyncQueue
from tfservo.core.errors import NotFound
from tfservo.http.responses import error_response, json_response

__all__ = ["AsyncRoutes"]


class AsyncRoutes:
    """The asynchronous requests' own GET (the submission is a hot route)."""

    def __init__(self, queue: AsyncQueue | None) -> None:
        self.queue = queue

    async def status(self, request: Request) -> Response:
        inference_id = request.path_params["InferenceId"]
        queue = self.queue
        if queue is None:
            return error_response(NotFound("this server takes no asynchronous requests (no --async-inference-config)"))
        found = await anyio.to_thread.run_sync(lambda: queue.get(inference_id))
        if found is None:
            return error_response(NotFound(f"no asynchronous request {inference_id} in {queue.folder}"))
        return json_response(found.as_json())
