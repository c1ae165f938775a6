"""Serve the models of TF Serving's model config file, and swap them on a reload.

`load_file` applies `--model-config-file` at start; `reload_config` takes a new
ModelServerConfig (text or proto, as gRPC's HandleReloadConfigRequest carries it) and makes
the served config-file models match it, as TF Serving does: models missing from the new list
are unloaded, new ones loaded, and kept ones get their new version policy and labels (a
changed base_path reloads the model). Models that came from bundles or multi-model loads are
not touched, and a config may not reuse their names.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from tfservo.core.errors import AlreadyExists, InvalidArgument
from tfservo.models.bundle import ModelSource, discover_versions
from tfservo.models.model_config import (
    ModelConfig,
    VersionPolicy,
    parse_model_server_config,
    read_model_config_file,
    single_model_config,
)

__all__ = ["ConfigFilePoller", "ModelConfigReloader", "ServedModels"]

log = logging.getLogger("tfservo.model_config")


class ServedModels(Protocol):
    """What a reload changes: the service's served models (ModelService)."""

    def model_names(self) -> list[str]: ...

    def add_model(
        self, source: ModelSource, policy: VersionPolicy | None = None, labels: Mapping[str, int] | None = None
    ) -> None: ...

    def remove_model(self, name: str) -> None: ...

    def update_model(self, name: str, policy: VersionPolicy, labels: Mapping[str, int]) -> None: ...

    def mark_arrived(self, root: str, how: str) -> None: ...


class ModelConfigReloader:
    """The config-file models of one service."""

    def __init__(self, service: ServedModels) -> None:
        self.service = service
        self._configs: dict[str, ModelConfig] = {}
        self._lock = threading.Lock()

    def model_names(self) -> list[str]:
        """The models served from the model config (file or last reload)."""
        return sorted(self._configs)

    def load_file(self, path: str) -> None:
        """Serve the models of a text ModelServerConfig file (--model-config-file)."""
        configs = read_model_config_file(path)
        self._apply(configs, source=f"model config file {path}")

    def load_base_path(self, name: str, base_path: str) -> None:
        """Serve one model from its base path, as TF Serving's --model_name/--model_base_path do
        (TF Serving builds the same one-entry config internally)."""
        self._apply([single_model_config(name, base_path)], source=f"--model_base_path {base_path}")

    def reload_config(self, config: str | bytes | object, *, arrived: str | None = None) -> None:
        """Make the served config models match `config` (text or ModelServerConfig proto);
        `arrived` names a door other than the operator's file it came through (the scan policy's
        auto refuses what such models can do beyond computing).

        Raises a ServingError (InvalidArgument, AlreadyExists, ...) naming the model when the
        config cannot be applied; models changed before the failing one stay changed, as in
        TF Serving.
        """
        configs = parse_model_server_config(config, source="reloaded model config")
        self._apply(configs, source="reloaded model config", arrived=arrived)

    def _apply(self, configs: list[ModelConfig], *, source: str, arrived: str | None = None) -> None:
        with self._lock:
            others = set(self.service.model_names()) - set(self._configs)
            for config in configs:
                if config.name in others:
                    raise AlreadyExists(
                        f"{source} names model {config.name}, which is already served from a "
                        "bundle or a multi-model load; rename it in the config"
                    )
                self._check_base_path(config, source)
            wanted = {c.name: c for c in configs}
            for name in sorted(set(self._configs) - set(wanted)):
                log.info("model %s: no longer in the model config; unloading", name)
                self.service.remove_model(name)
                del self._configs[name]
            for config in configs:
                current = self._configs.get(config.name)
                if current is not None and current.base_path == config.base_path:
                    self.service.update_model(config.name, config.policy, config.labels)
                    self._configs[config.name] = config
                    continue
                if current is not None:
                    log.info("model %s: base path changed to %s; reloading", config.name, config.base_path)
                    self.service.remove_model(config.name)
                    del self._configs[config.name]
                if arrived:
                    self.service.mark_arrived(config.base_path, arrived)
                self._add(config)
                self._configs[config.name] = config

    def _add(self, config: ModelConfig) -> None:
        code_dir = os.path.join(config.base_path, "code")
        source = ModelSource(
            config.name,
            config.base_path,
            discover_versions(config.base_path),
            code_dir if os.path.isdir(code_dir) else None,
        )
        log.info(
            "model %s: serving %s with version policy %s%s",
            config.name, config.base_path, config.policy,
            f" and labels {config.labels}" if config.labels else "",
        )
        self.service.add_model(source, config.policy, config.labels)

    @staticmethod
    def _check_base_path(config: ModelConfig, source: str) -> None:
        if not os.path.isdir(config.base_path):
            raise InvalidArgument(
                f"{source}: base_path {config.base_path} of model {config.name} is not a directory; "
                "point it at the dir holding the model's numeric version dirs"
            )
        if not discover_versions(config.base_path):
            log.warning(
                "model %s: no version dirs under %s yet; it becomes AVAILABLE when one appears "
                "(with --file-system-poll-wait-seconds)", config.name, config.base_path,
            )


class ConfigFilePoller:
    """Re-reads --model-config-file every `seconds` and applies it when its text changed
    (TF Serving's --model_config_file_poll_wait_seconds). A config that cannot be applied is
    logged and the served models stay as they are."""

    def __init__(self, service: Any, path: str, seconds: float) -> None:
        self.service = service
        self.path = path
        self.seconds = seconds
        self._stop = threading.Event()
        self._last = self._read()
        self._thread = threading.Thread(target=self._loop, name="tfservo-config-poll", daemon=True)

    def start(self) -> ConfigFilePoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _read(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            log.warning("model config file %s cannot be read (%s); keeping the served models", self.path, exc.strerror)
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            text = self._read()
            if text is None or text == self._last:
                continue
            self._last = text
            try:
                self.service.model_config.reload_config(text)
                log.info("model config file %s changed: applied", self.path)
            except Exception as exc:
                log.error("model config file %s changed but cannot be applied: %s", self.path, exc)
