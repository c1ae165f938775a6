"""The Open Inference Protocol's gRPC messages (package `inference`), built from a descriptor
written here from the protocol's specification (field names and numbers are the wire format),
in a private descriptor pool so that a client library's copy in the same process cannot clash.
Only the messages of the calls tfservo answers are defined."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["SERVICE", "messages"]

SERVICE = "inference.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "int64": _F.TYPE_INT64, "int32": _F.TYPE_INT32,
    "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE,
    "bytes": _F.TYPE_BYTES,
}

# message → [(field, number, type, repeated)]; a type not in _SCALARS names a message.
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool", False)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", False)],
    "ModelReadyRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelReadyResponse": [("ready", 1, "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string", False), ("version", 2, "string", False),
                               ("extensions", 3, "string", True)],
    "ModelMetadataRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "TensorMetadata": [("name", 1, "string", False), ("datatype", 2, "string", False), ("shape", 3, "int64", True)],
    "ModelMetadataResponse": [("name", 1, "string", False), ("versions", 2, "string", True),
                              ("platform", 3, "string", False), ("inputs", 4, "TensorMetadata", True),
                              ("outputs", 5, "TensorMetadata", True)],
    "InferTensorContents": [("bool_contents", 1, "bool", True), ("int_contents", 2, "int32", True),
                            ("int64_contents", 3, "int64", True), ("uint_contents", 4, "uint32", True),
                            ("uint64_contents", 5, "uint64", True), ("fp32_contents", 6, "float", True),
                            ("fp64_contents", 7, "double", True), ("bytes_contents", 8, "bytes", True)],
    "InferInputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False), ("shape", 3, "int64", True),
                         ("parameters", 4, "map", True), ("contents", 5, "InferTensorContents", False)],
    "InferRequestedOutputTensor": [("name", 1, "string", False), ("parameters", 2, "map", True)],
    "ModelInferRequest": [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                          ("id", 3, "string", False), ("parameters", 4, "map", True),
                          ("inputs", 5, "InferInputTensor", True), ("outputs", 6, "InferRequestedOutputTensor", True),
                          ("raw_input_contents", 7, "bytes", True)],
    "InferOutputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False), ("shape", 3, "int64", True),
                          ("parameters", 4, "map", True), ("contents", 5, "InferTensorContents", False)],
    # the model configuration extension: the fields of Triton's ModelConfig tfservo fills
    # (data_type is Triton's DataType enum, the same varint on the wire as int32)
    "ModelConfigRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelInput": [("name", 1, "string", False), ("data_type", 2, "int32", False), ("dims", 4, "int64", True)],
    "ModelOutput": [("name", 1, "string", False), ("data_type", 2, "int32", False), ("dims", 3, "int64", True)],
    "ModelVersionPolicyLatest": [("num_versions", 1, "uint32", False)],
    "ModelVersionPolicyAll": [],
    "ModelVersionPolicySpecific": [("versions", 1, "int64", True)],
    "ModelVersionPolicy": [("latest", 1, "ModelVersionPolicyLatest", False), ("all", 2, "ModelVersionPolicyAll", False),
                           ("specific", 3, "ModelVersionPolicySpecific", False)],
    "ModelDynamicBatching": [("preferred_batch_size", 1, "int32", True),
                             ("max_queue_delay_microseconds", 2, "uint64", False)],
    "ModelConfig": [("name", 1, "string", False), ("platform", 2, "string", False),
                    ("version_policy", 3, "ModelVersionPolicy", False), ("max_batch_size", 4, "int32", False),
                    ("input", 5, "ModelInput", True), ("output", 6, "ModelOutput", True),
                    ("dynamic_batching", 11, "ModelDynamicBatching", False), ("backend", 17, "string", False)],
    "ModelConfigResponse": [("config", 1, "ModelConfig", False)],
    # the statistics extension
    "ModelStatisticsRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "StatisticDuration": [("count", 1, "uint64", False), ("ns", 2, "uint64", False)],
    "InferStatistics": [(field, number, "StatisticDuration", False) for number, field in enumerate(
        ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"), 1)],
    "InferBatchStatistics": [("batch_size", 1, "uint64", False), ("compute_input", 2, "StatisticDuration", False),
                             ("compute_infer", 3, "StatisticDuration", False),
                             ("compute_output", 4, "StatisticDuration", False)],
    "ModelStatistics": [("name", 1, "string", False), ("version", 2, "string", False),
                        ("last_inference", 3, "uint64", False), ("inference_count", 4, "uint64", False),
                        ("execution_count", 5, "uint64", False), ("inference_stats", 6, "InferStatistics", False),
                        ("batch_stats", 7, "InferBatchStatistics", True)],
    "ModelStatisticsResponse": [("model_stats", 1, "ModelStatistics", True)],
    "RepositoryIndexRequest": [("repository_name", 1, "string", False), ("ready", 2, "bool", False)],
    "ModelIndex": [("name", 1, "string", False), ("version", 2, "string", False), ("state", 3, "string", False),
                   ("reason", 4, "string", False)],
    "RepositoryIndexResponse": [("models", 1, "ModelIndex", True)],
    # map<string, ModelRepositoryParameter>: a load's config and file: contents (service.v2_dataplane checks them)
    "RepositoryModelLoadRequest": [("repository_name", 1, "string", False), ("model_name", 2, "string", False),
                                   ("parameters", 3, "repository_map", True)],
    "RepositoryModelLoadResponse": [],
    "RepositoryModelUnloadRequest": [("repository_name", 1, "string", False), ("model_name", 2, "string", False)],
    "RepositoryModelUnloadResponse": [],
    # the shared-memory extensions (the status maps' value messages are nested in the spec; the
    # wire does not see message names, so they stand at the top here)
    "SystemSharedMemoryRegionStatus": [("name", 1, "string", False), ("key", 2, "string", False),
                                       ("offset", 3, "uint64", False), ("byte_size", 4, "uint64", False)],
    "SystemSharedMemoryStatusRequest": [("name", 1, "string", False)],
    "SystemSharedMemoryStatusResponse": [("regions", 1, "system_regions", True)],
    "SystemSharedMemoryRegisterRequest": [("name", 1, "string", False), ("key", 2, "string", False),
                                          ("offset", 3, "uint64", False), ("byte_size", 4, "uint64", False)],
    "SystemSharedMemoryRegisterResponse": [],
    "SystemSharedMemoryUnregisterRequest": [("name", 1, "string", False)],
    "SystemSharedMemoryUnregisterResponse": [],
    "CudaSharedMemoryRegionStatus": [("name", 1, "string", False), ("device_id", 2, "uint64", False),
                                     ("byte_size", 3, "uint64", False)],
    "CudaSharedMemoryStatusRequest": [("name", 1, "string", False)],
    "CudaSharedMemoryStatusResponse": [("regions", 1, "cuda_regions", True)],
    "CudaSharedMemoryRegisterRequest": [("name", 1, "string", False), ("raw_handle", 2, "bytes", False),
                                        ("device_id", 3, "int64", False), ("byte_size", 4, "uint64", False)],
    "CudaSharedMemoryRegisterResponse": [],
    "CudaSharedMemoryUnregisterRequest": [("name", 1, "string", False)],
    "CudaSharedMemoryUnregisterResponse": [],
    "ModelInferResponse": [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                           ("id", 3, "string", False), ("parameters", 4, "map", True),
                           ("outputs", 5, "InferOutputTensor", True), ("raw_output_contents", 6, "bytes", True)],
}
# Nested in the spec: the tensors of a request or response, and the TensorMetadata of metadata.
_NESTED = {"InferInputTensor": "ModelInferRequest", "InferRequestedOutputTensor": "ModelInferRequest",
           "InferOutputTensor": "ModelInferResponse", "TensorMetadata": "ModelMetadataResponse",
           "ModelIndex": "RepositoryIndexResponse"}


_MAPS = {"map": "InferParameter", "repository_map": "ModelRepositoryParameter",  # a map field's value type
         "system_regions": "SystemSharedMemoryRegionStatus", "cuda_regions": "CudaSharedMemoryRegionStatus"}
# the parameter messages: (field, number, type) of their one oneof, parameter_choice
_PARAMETERS = {
    "InferParameter": (("bool_param", 1, "bool"), ("int64_param", 2, "int64"), ("string_param", 3, "string"),
                       ("double_param", 4, "double"), ("uint64_param", 5, "uint64")),
    "ModelRepositoryParameter": (("bool_param", 1, "bool"), ("int64_param", 2, "int64"),
                                 ("string_param", 3, "string"), ("bytes_param", 4, "bytes")),
}


def _full(name: str) -> str:
    return f".inference.{_NESTED[name]}.{name}" if name in _NESTED else f".inference.{name}"


def _message(name: str, fields: list[tuple[str, int, str, bool]]) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind, repeated in fields:
        field = proto.field.add(name=field_name, number=number,
                                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
        if kind in _MAPS:  # map<string, InferParameter or ModelRepositoryParameter>: a nested entry message
            entry_name = field_name.title().replace("_", "") + "Entry"  # protoc's name for a map's entry
            entry = proto.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
            entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL, type=_F.TYPE_MESSAGE,
                            type_name=f".inference.{_MAPS[kind]}")
            field.type, field.type_name = _F.TYPE_MESSAGE, f"{_full(name)}.{entry_name}"
        elif kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:
            field.type, field.type_name = _F.TYPE_MESSAGE, _full(kind)
    return proto


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="tfservo_v2_inference.proto", package="inference", syntax="proto3")
    for message, choices in _PARAMETERS.items():
        parameter = file.message_type.add(name=message)
        parameter.oneof_decl.add(name="parameter_choice")
        for field_name, number, kind in choices:
            parameter.field.add(name=field_name, number=number, label=_F.LABEL_OPTIONAL, type=_SCALARS[kind],
                                oneof_index=0)
    built = {name: _message(name, fields) for name, fields in _MESSAGES.items()}
    for name, proto in built.items():
        if name in _NESTED:
            built[_NESTED[name]].nested_type.append(proto)
    for name, proto in built.items():
        if name not in _NESTED:
            file.message_type.append(proto)
    return file


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(_file().SerializeToString())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(_full(name)[1:]))
        for name in [*_MESSAGES, *_PARAMETERS]
    }


messages = _classes()
