"""The V2 data plane: server and model metadata, readiness and inference, over TF Serving's API
(so V2 calls share model selection, batching and the runtime with every other caller). REST
and gRPC both call it; neither knows the other."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tfservo.codecs.v2 import V2_OF_TF, SharedRead, SharedSpan, SharedWrite, V2Error
from tfservo.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServingError,
    Unimplemented,
)
from tfservo.core.version import __version__
from tfservo.models.bundle import is_model_name
from tfservo.models.calls import Answer, InferRequest, InferResponse, PredictCall, Prediction, parse_version
from tfservo.models.servables import ServableHandle, State
from tfservo.models.signatures import DEFAULT_SIGNATURE
from tfservo.service.api import TFServingAPI
from tfservo.service.model_statistics import ModelStatistics, VersionStatistics
from tfservo.service.shared_memory import SharedMemoryRegions
from tfservo.service.triton_config import PLATFORM, LoadConfig, check_load_parameters, model_config_doc

if TYPE_CHECKING:
    from tfservo.models.batching import BatchingRunnerFactory

__all__ = ["EXTENSIONS", "TRITON_TYPE_NUMBERS", "V2DataPlane", "parse_v2_version", "unknown_model"]

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
SHARED_MEMORY_EXTENSION = "system_shared_memory"  # listed when --shared-memory system; CUDA's never (no GPU)
# Triton's DataType enum numbers, for the gRPC door's ModelConfig (TYPE_ + the name)
TRITON_TYPE_NUMBERS = {name: number for number, name in enumerate(
    ("INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
     "FP64", "STRING", "BF16"))}


def parse_v2_version(text: str | None) -> int | None:
    """A V2 model version (URL or message): `parse_version`'s rule, in Triton's words, which
    tritonclient's callers check."""
    try:
        return parse_version(text)
    except InvalidArgument:
        raise InvalidArgument(f"failed to get model version from specified version string '{text}'") from None


def unknown_model(name: str) -> NotFound:
    """A model the server has no such name for, in Triton's words on the V2 door."""
    return NotFound(f"Request for unknown model: '{name}' is not found")




class V2DataPlane:
    """What V2 asks of a server, answered from the model manager and TF Serving's API."""

    def __init__(
        self, api: TFServingAPI, unavailable: Callable[[], list[str]] | None = None, repository: object = None,
        statistics: ModelStatistics | None = None, regions: SharedMemoryRegions | None = None,
        batching: BatchingRunnerFactory | None = None,
    ) -> None:
        self.api = api
        self.batching = batching  # the service's batchers' options, per model (None: no batching)
        self.regions = regions  # the system shared-memory extension's registrations (None: off)
        self.statistics = statistics or ModelStatistics()  # the runtime's metrics' (every door records there)
        self._unavailable: Callable[[], list[str]] = unavailable or (lambda: [])
        self.repository = repository  # multi-model mode's MultiModelEndpoint: the model repository extension
        self._configs: dict[str, LoadConfig] = {}  # what each model's repository load asked (one worker then)

    def server_metadata(self) -> dict[str, object]:
        extensions = sorted([*EXTENSIONS, *([SHARED_MEMORY_EXTENSION] if self.regions is not None else [])])
        return {"name": "tfservo", "version": __version__, "extensions": extensions}

    def server_ready(self) -> bool:
        return not self._unavailable()

    def model_ready(self, name: str, version: int | None) -> bool:
        if not self.api.manager.has_model(name):
            raise unknown_model(name)
        versions = self.api.manager.model(name).versions
        if version is not None:
            sv = versions.get(version)
            if sv is None:
                raise NotFound(f"model {name} has no version {version}")
            return sv.state is State.AVAILABLE
        return any(v.state is State.AVAILABLE for v in versions.values())

    def model_metadata(self, name: str, version: int | None, signature_name: str | None = None) -> dict[str, Any]:
        """Inputs and outputs of the signature (serving_default unless named), V2 datatypes."""
        self._known(name)
        with self.api.manager.acquire(name, version, None) as sv:
            signature = sv.signature(signature_name or DEFAULT_SIGNATURE)
            versions = [str(v) for v, s in sorted(self.api.manager.model(name).versions.items())
                        if s.state is State.AVAILABLE]

            def tensors(specs: dict[str, Any]) -> list[dict[str, Any]]:
                return [{"name": key, "datatype": V2_OF_TF.get(spec.dtype, spec.dtype),
                         "shape": list(spec.shape) if spec.shape is not None else [-1]}
                        for key, spec in sorted(specs.items())]

            return {"name": name, "versions": versions, "platform": PLATFORM,
                    "inputs": tensors(signature.inputs), "outputs": tensors(signature.outputs)}

    # -- the model repository extension: multi-model mode's model root --------------------------

    def _root(self) -> Any:
        if self.repository is None:
            raise FailedPrecondition(
                "the model repository extension needs tfservo serve --multi-model (a model root to load from)"
            )
        return self.repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model dir under the model root and every loaded model, with its state."""
        endpoint = self._root()
        loaded = set(endpoint.list_models())
        names = set(loaded)
        if not endpoint.remote_root and os.path.isdir(endpoint.model_root):
            names |= {e.name for e in os.scandir(endpoint.model_root) if e.is_dir() and is_model_name(e.name)
                      and e.name != "code"}
        index = []
        for name in sorted(names):
            entry = {"name": name, "state": "READY" if name in loaded else "UNAVAILABLE"}
            if name not in loaded:
                entry["reason"] = "unloaded"
            if not ready_only or name in loaded:
                index.append(entry)
        return index

    def repository_load(self, name: str, parameters: Mapping[str, object] | None = None) -> None:
        """Load the model dir `name` under the root, its load `parameters` checked first
        (`check_load_parameters`). Already loaded: nothing to do without a config, as in Triton;
        with one, the model is loaded again under it (its batching and version policy)."""
        config = check_load_parameters(name, parameters or {})
        endpoint = self._root()
        batching = config.batching(name, self.batching.options_for(None) if self.batching else None) if config else None
        if endpoint.is_loaded(name):
            if config is None:
                return
            endpoint.unload(name)
        if self.batching is not None:
            self.batching.set_model_options(name, batching)
        try:
            endpoint.load(name, name, policy=config.version_policy if config else None)
        except AlreadyExists:
            return
        except BaseException as exc:
            if self.batching is not None:
                self.batching.set_model_options(name, None)
            self._configs.pop(name, None)
            if isinstance(exc, ServingError) and not exc.message.startswith("failed to load"):
                raise ServingError(f"failed to load '{name}': {exc.message}", exc.code) from None  # Triton's words
            raise
        if config is None:
            self._configs.pop(name, None)
        else:
            self._configs[name] = config

    def repository_unload(self, name: str) -> None:
        self._root().unload(name)

    # -- the shared-memory extensions: system (POSIX) regions; CUDA's refused -------------------

    def _shared(self) -> SharedMemoryRegions:
        if self.regions is None:
            raise Unimplemented("system shared memory is off on this server (--shared-memory off); send tensors "
                                "in the request")
        return self.regions

    def shm_register(self, name: object, key: object, offset: object, byte_size: object, peer: str) -> None:
        self._shared().register(name, key, offset, byte_size, peer)

    def shm_unregister(self, name: str | None) -> None:
        self._shared().unregister(name)

    def shm_status(self, name: str | None) -> list[dict[str, object]]:
        return self._shared().status(name)

    @staticmethod
    def cuda_shm_register() -> None:
        raise Unimplemented("CUDA shared memory is not supported: tfservo serves on CPU; use system shared memory "
                            "(register_system_shared_memory) or send tensors in the request")

    @staticmethod
    def cuda_shm_status(name: str | None) -> list[dict[str, object]]:
        """Nothing is ever registered (an unregister of everything is no error, as clients call it)."""
        if name:
            raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
        return []

    @property
    def shared_io(self) -> tuple[SharedRead | None, SharedWrite | None]:
        """What the codecs read inputs and write outputs in shared memory through (None: off)."""
        if self.regions is None:
            return None, None
        return self.shared_read, self.shared_write

    def shared_read(self, span: SharedSpan, what: str) -> bytes:
        """An input's bytes from its registered region (codecs.v2.SharedRead)."""
        return self._shared().read(span.region, span.offset, span.byte_size, what)

    def shared_write(self, span: SharedSpan, data: bytes, what: str) -> None:
        """An output's bytes into its registered region (codecs.v2.SharedWrite)."""
        self._shared().write(span.region, span.offset, span.byte_size, data, what)

    def close(self) -> None:
        if self.regions is not None:
            self.regions.close()

    def prepare(self, request: InferRequest) -> tuple[ServableHandle, PredictCall]:
        """The request as its model call on its signature (`signature_name` parameter, else
        serving_default), the version it names held for it (the caller runs the call, e.g.
        queued for its batch by `TFServingAPI.submit`, and releases the handle)."""
        self._known(request.model)
        signature_name = request.parameters.get("signature_name") or DEFAULT_SIGNATURE
        if not isinstance(signature_name, str):
            raise V2Error("parameter signature_name must be a string")
        return self.api.prepare_predict(request.model, request.version, None, signature_name, request.inputs,
                                        request.outputs)

    def model_config(self, name: str, version: int | None) -> dict[str, Any]:
        """V2's model configuration extension, in Triton's ModelConfig fields: the serving_default
        signature's tensors with Triton's data types and dims, the batching the model runs under
        and, after a repository load with a config, what that config set."""
        meta = self.model_metadata(name, version)
        config = self._configs.get(name)
        batched = config is not None and config.max_batch_size is not None
        batching = self.batching.options_for(name) if self.batching else None
        return model_config_doc(name, meta["inputs"], meta["outputs"], batching, batched,
                                config.version_policy if config else None)

    def model_statistics(self, name: str | None, version: int | None) -> dict[str, object]:
        """V2's statistics extension: every served version of `name` (every model when None), or
        the one `version`, with its counts (statistics.ModelStatistics; zeros before traffic)."""
        if name:
            self._known(name)
        names = [name] if name else sorted(self.api.manager.model_names())
        entries = []
        for model in names:
            versions = self.api.manager.model(model).versions
            if version is not None and version not in versions:
                raise NotFound(f"Request for unknown model: '{model}' version {version} is not found")
            for number, sv in sorted(versions.items()):
                if (version is not None and number != version) or (version is None and sv.state is not State.AVAILABLE):
                    continue
                entries.append(_statistics_doc(model, str(number), self.statistics.of(model, str(number))))
        return {"model_stats": entries}

    def _known(self, name: str) -> None:
        if not self.api.manager.has_model(name):
            raise unknown_model(name)

    @staticmethod
    def response(request: InferRequest, answer: Answer) -> InferResponse:
        """A predict's answer as the request's V2 response."""
        assert isinstance(answer, Prediction)
        return InferResponse(answer.model_name, answer.version, request.id, answer.outputs)


def _statistics_doc(model: str, version: str, stats: VersionStatistics) -> dict[str, object]:
    """One version's counts in the extension's JSON (the gRPC door writes the same fields)."""
    zero = {"count": 0, "ns": 0}
    return {
        "name": model, "version": version, "last_inference": stats.last_inference,
        "inference_count": stats.inference_count, "execution_count": stats.execution_count,
        "inference_stats": {
            "success": stats.success.doc(), "fail": stats.fail.doc(), "queue": stats.queue.doc(),
            "compute_input": zero, "compute_infer": stats.compute_infer.doc(), "compute_output": zero,
            "cache_hit": zero, "cache_miss": zero,
        },
        "batch_stats": [
            {"batch_size": size, "compute_input": {"count": d.count, "ns": 0}, "compute_infer": d.doc(),
             "compute_output": {"count": d.count, "ns": 0}}
            for size, d in sorted(stats.batches.items())
        ],
    }

