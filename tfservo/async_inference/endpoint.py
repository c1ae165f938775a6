"""One worker process's asynchronous inference, from the settings: the queue on the state
folder, the intake the HTTP route hands calls to, the runner's threads."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from tfservo.async_inference.config import read_async_config
from tfservo.async_inference.intake import AsyncIntake
from tfservo.async_inference.queue import AsyncQueue
from tfservo.async_inference.runner import AsyncRunner
from tfservo.core.settings import Settings
from tfservo.service.factory import ModelService

__all__ = ["AsyncEndpoint", "state_folder"]


def state_folder(settings: Settings) -> str:
    """--async-state, else tfservo-async/ENDPOINT in the temporary folder."""
    return settings.async_state or os.path.join(tempfile.gettempdir(), "tfservo-async", settings.endpoint_name or "tfservo")


class AsyncEndpoint:
    """Queue, intake and runner of one worker process (they share the queue with the others)."""

    def __init__(
        self,
        service: ModelService,
        settings: Settings,
        *,
        on_event: Callable[[str, float], None] = lambda event, seconds: None,
        on_backlog: Callable[[dict[str, int]], None] = lambda counts: None,
    ) -> None:
        assert settings.async_inference_config is not None
        config = read_async_config(settings.async_inference_config)
        self.queue = AsyncQueue(state_folder(settings))
        self.runner = AsyncRunner(service, self.queue, config, endpoint=settings.endpoint_name or "tfservo",
                                  region=_region(), on_event=on_event, on_backlog=on_backlog)
        self.intake = AsyncIntake(self.queue, config, input_root=settings.async_input_root, wake=self.runner.wake)

    def start(self) -> AsyncEndpoint:
        self.runner.start()
        return self

    def close(self) -> None:
        """Take no more requests, let those running finish (a request cut short runs again later)."""
        self.runner.stop()
        self.queue.close()


def _region() -> str:
    """The region the notifications name: the one boto3 is configured for."""
    import boto3

    return boto3.session.Session().region_name or "us-east-1"
