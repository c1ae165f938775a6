"""`serve --reload` / `invoke --watch`: import a bundle's handler code again when it changes.

Watches every code dir the service runs an inference.py from (lib/ and helper modules
included) with watchfiles, and calls `ModelService.reload_code` for the dirs that changed:
the SavedModels and TensorFlow stay loaded, so an edited handler answers within a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tfservo.service.factory import ModelService

__all__ = ["CodeReloader"]

log = logging.getLogger("tfservo.reload")


class CodeReloader:
    """A thread reloading the service's handler code on change; `on_reload(dirs)` after each."""

    def __init__(self, service: ModelService, on_reload: Callable[[list[str]], None] | None = None) -> None:
        self.service = service
        self.on_reload = on_reload
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tfservo-code-reload", daemon=True)

    def start(self) -> CodeReloader:
        dirs = self.service.code_dirs()
        if not dirs:
            log.warning("--reload: the bundle has no code/inference.py to watch")
            return self
        log.info("watching %s for changes to the handler code", ", ".join(dirs))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        import watchfiles

        dirs = self.service.code_dirs()
        for changes in watchfiles.watch(*dirs, stop_event=self._stop, debounce=200, step=50, rust_timeout=500):
            paths = [path for _, path in changes if not path.endswith((".pyc", "~")) and "__pycache__" not in path]
            if not paths:
                continue
            reloaded = self.service.reload_code(paths)
            if reloaded and self.on_reload is not None:
                self.on_reload(reloaded)
