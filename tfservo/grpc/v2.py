"""`inference.GRPCInferenceService` (the Open Inference Protocol over gRPC) on the server's gRPC
port, beside TF Serving's services: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata and ModelInfer (tensors in `contents` or `raw_input_contents`; answers in
`raw_output_contents`, as Triton's clients read them). Errors are gRPC statuses."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from tfservo.auth.audit import ManagementGate
from tfservo.capture.taps import Taps
from tfservo.codecs.v2 import DTYPE_OF_V2, SharedRead, V2Error, decode_inputs, encode_outputs, shared_span
from tfservo.core.errors import NotFound
from tfservo.core.request_labels import RequestScope, plain_scope
from tfservo.grpc.methods import Method, SyncContext, peer_address, service_handler
from tfservo.grpc.tfserving import GrpcCalls
from tfservo.grpc.v2_protocol import SERVICE, messages
from tfservo.models.calls import Answer, InferRequest
from tfservo.service.call_placement import CallPlacement
from tfservo.service.queued_calls import Prepared, QueuedCalls
from tfservo.service.v2_dataplane import TRITON_TYPE_NUMBERS, V2DataPlane, parse_v2_version

__all__ = ["V2_METHODS", "V2Servicer", "v2_handler"]

_CONTENTS = {  # V2 datatype → InferTensorContents field
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _parameters(entries: Any) -> dict[str, Any]:
    out = {}
    for key, value in entries.items():
        choice = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, choice) if choice else None
    return out


class V2Servicer:
    """The V2 calls, each through the one V2 data plane."""

    def __init__(
        self, plane: V2DataPlane, placement: CallPlacement, queue: QueuedCalls, scope: RequestScope = plain_scope,
    ) -> None:
        self.plane = plane
        self.placement = placement  # where an inference runs when it is not queued for its batch
        self.queue = queue  # the gRPC door's batched predicts, queued from the loop
        self._calls = GrpcCalls(SERVICE, scope)

    def ServerLive(self, request: Any, context: SyncContext) -> Any:
        return self._calls.run("ServerLive", "live", context, lambda: messages["ServerLiveResponse"](live=True), request)

    def ServerReady(self, request: object, context: SyncContext) -> object:
        return self._calls.run("ServerReady", "ready", context,
                               lambda: messages["ServerReadyResponse"](ready=self.plane.server_ready()), request)

    def ModelReady(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            try:
                ready = self.plane.model_ready(request.name, parse_v2_version(request.version))
            except NotFound:  # as Triton answers: not loaded is not ready (REST's 404 reads so too)
                ready = False
            return messages["ModelReadyResponse"](ready=ready)

        return self._calls.run("ModelReady", "ready", context, run, request)

    def ModelConfig(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            doc = self.plane.model_config(request.name, parse_v2_version(request.version))
            config = messages["ModelConfig"](name=doc["name"], platform=doc["platform"], backend=doc["backend"],
                                              max_batch_size=doc["max_batch_size"])
            for key, field in (("input", config.input), ("output", config.output)):
                for tensor in doc[key]:
                    field.add(name=tensor["name"], dims=tensor["dims"],
                              data_type=TRITON_TYPE_NUMBERS.get(tensor["data_type"].removeprefix("TYPE_"), 0))
            if "dynamic_batching" in doc:
                json_format.ParseDict(doc["dynamic_batching"], config.dynamic_batching)
            if "version_policy" in doc:
                json_format.ParseDict(doc["version_policy"], config.version_policy)
            return messages["ModelConfigResponse"](config=config)

        return self._calls.run("ModelConfig", "metadata", context, run, request)

    def ModelStatistics(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            doc = self.plane.model_statistics(request.name or None, parse_v2_version(request.version))
            return json_format.ParseDict(doc, messages["ModelStatisticsResponse"]())

        return self._calls.run("ModelStatistics", "statistics", context, run, request)

    def ServerMetadata(self, request: object, context: SyncContext) -> object:
        return self._calls.run("ServerMetadata", "metadata", context,
                               lambda: messages["ServerMetadataResponse"](**self.plane.server_metadata()), request)

    def ModelMetadata(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            meta = self.plane.model_metadata(request.name, parse_v2_version(request.version))
            answer = messages["ModelMetadataResponse"](name=meta["name"], versions=meta["versions"],
                                                       platform=meta["platform"])
            for side in ("inputs", "outputs"):
                for tensor in meta[side]:
                    getattr(answer, side).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
            return answer

        return self._calls.run("ModelMetadata", "metadata", context, run, request)

    def RepositoryIndex(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            answer = messages["RepositoryIndexResponse"]()
            for entry in self.plane.repository_index(request.ready):
                answer.models.add(**entry)
            return answer

        return self._calls.run("RepositoryIndex", "repository", context, run, request)

    def RepositoryModelLoad(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            parameters = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                          for key, value in request.parameters.items()}
            self.plane.repository_load(request.model_name, parameters)
            return messages["RepositoryModelLoadResponse"]()

        return self._calls.run("RepositoryModelLoad", "load", context, run, request)

    def RepositoryModelUnload(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            self.plane.repository_unload(request.model_name)
            return messages["RepositoryModelUnloadResponse"]()

        return self._calls.run("RepositoryModelUnload", "unload", context, run, request)

    def SystemSharedMemoryStatus(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            answer = messages["SystemSharedMemoryStatusResponse"]()
            for region in self.plane.shm_status(request.name or None):
                answer.regions[str(region["name"])].CopyFrom(messages["SystemSharedMemoryRegionStatus"](**region))
            return answer

        return self._calls.run("SystemSharedMemoryStatus", "shared_memory", context, run, request)

    def SystemSharedMemoryRegister(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            self.plane.shm_register(request.name, request.key, request.offset, request.byte_size,
                                    peer_address(context.peer()))
            return messages["SystemSharedMemoryRegisterResponse"]()

        return self._calls.run("SystemSharedMemoryRegister", "shared_memory", context, run, request)

    def SystemSharedMemoryUnregister(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            self.plane.shm_unregister(request.name or None)
            return messages["SystemSharedMemoryUnregisterResponse"]()

        return self._calls.run("SystemSharedMemoryUnregister", "shared_memory", context, run, request)

    def CudaSharedMemoryStatus(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            self.plane.cuda_shm_status(request.name or None)
            return messages["CudaSharedMemoryStatusResponse"]()

        return self._calls.run("CudaSharedMemoryStatus", "shared_memory", context, run, request)

    def CudaSharedMemoryRegister(self, request: Any, context: SyncContext) -> Any:
        def run() -> object:
            self.plane.cuda_shm_register()
            return messages["CudaSharedMemoryRegisterResponse"]()

        return self._calls.run("CudaSharedMemoryRegister", "shared_memory", context, run, request)

    def CudaSharedMemoryUnregister(self, request: Any, context: SyncContext) -> Any:
        return self._calls.run("CudaSharedMemoryUnregister", "shared_memory", context,
                               messages["CudaSharedMemoryUnregisterResponse"], request)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> object:
        return await self._calls.run_async("ModelInfer", "predict", context, lambda: self._infer(request), request)

    async def _infer(self, request: Any) -> Any:
        """Queued for its batch when small and batched, as TF Serving's Predict (grpc.tfserving)."""
        name = request.model_name
        return await self.queue.run(self.placement, (name, "v2"), name, request.ByteSize(), lambda: self._prepare(request))

    def _prepare(self, request: Any) -> Prepared[Any]:
        """The request as the data plane's call (its version held), and how its answer becomes
        a ModelInferResponse."""
        read, write = self.plane.shared_io
        infer = self._infer_request(request, read)
        handle, call = self.plane.prepare(infer)

        def finish(answer: Answer) -> Any:
            response = self.plane.response(infer, answer)
            listed, parts = encode_outputs(response.outputs, {name: True for name in response.outputs},
                                           infer.output_parameters, write)
            message = messages["ModelInferResponse"](model_name=response.model, model_version=str(response.version),
                                                     id=request.id)
            for entry in listed:
                tensor = message.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
                placed = entry.get("parameters")
                if isinstance(placed, dict) and "shared_memory_region" in placed:
                    tensor.parameters["shared_memory_region"].string_param = placed["shared_memory_region"]
                    tensor.parameters["shared_memory_byte_size"].int64_param = placed["shared_memory_byte_size"]
            message.raw_output_contents.extend(part or b"" for part in parts)
            return message

        return handle, call, finish

    @staticmethod
    def _infer_request(request: Any, shared: SharedRead | None = None) -> InferRequest:
        """A ModelInferRequest's tensors (`contents`, `raw_input_contents` or a shared-memory
        region, read through `shared`) as the data plane's request."""
        in_shared = [bool(tensor.parameters.get("shared_memory_region")) for tensor in request.inputs]
        raw = list(request.raw_input_contents)
        if raw and len(raw) != in_shared.count(False):
            raise V2Error(f"{len(raw)} raw_input_contents for {in_shared.count(False)} inputs outside shared memory: "
                          "send one per input")
        tensors, binary, next_raw = [], b"", 0
        for tensor, shared_input in zip(request.inputs, in_shared):
            doc: dict[str, object] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
            if raw and tensor.HasField("contents") and tensor.contents.ByteSize():
                raise V2Error(f"contents field must not be specified when using raw_input_contents for "
                              f"'{tensor.name}' for model '{request.model_name}'")
            if shared_input:
                doc["parameters"] = _parameters(tensor.parameters)
            elif raw:
                doc["parameters"] = {"binary_data_size": len(raw[next_raw])}
                binary += raw[next_raw]
                next_raw += 1
            else:
                field = _CONTENTS.get(tensor.datatype)
                if field is None:
                    raise V2Error(f"input {tensor.name}: datatype {tensor.datatype!r} is not one tfservo takes; "
                                  f"use one of {', '.join(DTYPE_OF_V2)}")
                values = list(getattr(tensor.contents, field))
                doc["data"] = [v.decode("utf-8", "surrogateescape") for v in values] if field == "bytes_contents" else values
            tensors.append(doc)
        inputs = decode_inputs(tensors, binary, shared)
        if not raw:  # BYTES from contents: keep the exact bytes
            for tensor, shared_input in zip(request.inputs, in_shared):
                if tensor.datatype == "BYTES" and not shared_input:
                    array = np.empty(len(tensor.contents.bytes_contents), dtype=object)
                    array[:] = list(tensor.contents.bytes_contents)
                    inputs[tensor.name] = array.reshape(list(tensor.shape))
        names = [o.name for o in request.outputs] or None
        output_parameters = {o.name: _parameters(o.parameters) for o in request.outputs if o.parameters}
        for name, params in output_parameters.items():
            shared_span(params, f"output {name}")  # a malformed span fails before the model runs
        return InferRequest(request.model_name, parse_v2_version(request.model_version), inputs, request.id or None,
                            _parameters(request.parameters), names, output_parameters)


V2_METHODS = (
    *(Method(name, messages[f"{name}Request"], messages[f"{name}Response"], None) for name in ("ServerLive", "ServerReady")),
    *(Method(name, messages[f"{name}Request"], messages[f"{name}Response"])
      for name in ("ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics",
                   "RepositoryIndex", "SystemSharedMemoryStatus", "CudaSharedMemoryStatus")),
    *(Method(name, messages[f"{name}Request"], messages[f"{name}Response"], "invoke")
      for name in ("SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryRegister",
                   "CudaSharedMemoryUnregister")),
    Method("ModelInfer", messages["ModelInferRequest"], messages["ModelInferResponse"], "invoke", inference=True),
    *(Method(name, messages[f"{name}Request"], messages[f"{name}Response"], "manage")
      for name in ("RepositoryModelLoad", "RepositoryModelUnload")),
)


def v2_handler(
    plane: V2DataPlane, placement: CallPlacement, queue: QueuedCalls, scope: RequestScope = plain_scope,
    gate: ManagementGate | None = None, taps: Taps | None = None,
) -> grpc.GenericRpcHandler:
    """The V2 service as a generic handler for GrpcServer (its predicts placed and queued as the
    server's own: `GrpcServer.placement`, `GrpcServer.queue`; ModelInfer captured by `taps`)."""
    return service_handler(SERVICE, V2Servicer(plane, placement, queue, scope), V2_METHODS, gate, taps)
