"""The KServe v2 gRPC protocol: every call as a request message, and how to read its answer.

Methods are called by their path on ``inference.GRPCInferenceService`` with the client's
own copy of the messages (package ``batchserve_client.v2``): the wire only depends on
field numbers, and the copy never clashes with tritonclient's ``inference`` messages.
Inputs travel as ``raw_input_contents``; outputs are read from ``raw_output_contents``,
or from typed ``contents`` for servers that send those. No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from batchserve_client._call import Call
from batchserve_client._infer import InferRequest, ParameterValue
from batchserve_client._proto import v2_pb2 as pb
from batchserve_client.errors import InvalidResponse
from batchserve_client.results import InferResult, ModelMetadata, ServerMetadata, TensorMetadata
from batchserve_client.retry import Retry
from batchserve_client.tensors import Array, from_bytes, from_json, to_bytes

T = TypeVar("T")
M = TypeVar("M", bound=Message)
SERVICE: Final = "/inference.GRPCInferenceService/"
_INT64: Final = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
# The typed contents field of each datatype (FP16 and BF16 only travel raw).
_CONTENTS: Final = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(frozen=True, slots=True)
class GrpcRequest:
    """A method of the service, the request message and the answer's message type."""

    method: str
    message: Message
    response_type: type[Message]

    @property
    def path(self) -> str:
        return SERVICE + self.method


GrpcCall = Call[GrpcRequest, Message, T]


def _call(
    method: str,
    message: Message,
    response_type: type[M],
    read: Callable[[M], T],
    retry: Retry = Retry.IDEMPOTENT,
) -> GrpcCall[T]:
    def checked(response: Message) -> T:
        if not isinstance(response, response_type):
            raise InvalidResponse(f"{method} answered with a {type(response).__name__}")
        return read(response)

    return Call(GrpcRequest(method, message, response_type), checked, retry)


class GrpcApi:
    """The calls of the gRPC protocol."""

    def is_live(self) -> GrpcCall[bool]:
        return _call(
            "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse, _live, Retry.NEVER
        )

    def is_ready(self) -> GrpcCall[bool]:
        return _call(
            "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, _ready, Retry.NEVER
        )

    def is_model_ready(self, model: str, version: str) -> GrpcCall[bool]:
        message = pb.ModelReadyRequest(name=model, version=version)
        return _call("ModelReady", message, pb.ModelReadyResponse, _model_ready, Retry.NEVER)

    def server_metadata(self) -> GrpcCall[ServerMetadata]:
        message = pb.ServerMetadataRequest()
        return _call("ServerMetadata", message, pb.ServerMetadataResponse, _server_metadata)

    def model_metadata(self, model: str, version: str) -> GrpcCall[ModelMetadata]:
        message = pb.ModelMetadataRequest(name=model, version=version)
        return _call("ModelMetadata", message, pb.ModelMetadataResponse, _model_metadata)

    def model_config(self, model: str, version: str) -> GrpcCall[dict[str, Any]]:
        message = pb.ModelConfigRequest(name=model, version=version)
        return _call("ModelConfig", message, pb.ModelConfigResponse, _config)

    def model_statistics(self, model: str, version: str) -> GrpcCall[list[dict[str, Any]]]:
        message = pb.ModelStatisticsRequest(name=model, version=version)
        return _call("ModelStatistics", message, pb.ModelStatisticsResponse, _statistics)

    def repository_index(self, ready: bool) -> GrpcCall[list[dict[str, Any]]]:
        message = pb.RepositoryIndexRequest(ready=ready)
        return _call("RepositoryIndex", message, pb.RepositoryIndexResponse, _index)

    def load_model(self, model: str) -> GrpcCall[None]:
        message = pb.RepositoryModelLoadRequest(model_name=model)
        response = pb.RepositoryModelLoadResponse
        return _call("RepositoryModelLoad", message, response, _none, Retry.UNAVAILABLE)

    def unload_model(self, model: str) -> GrpcCall[None]:
        message = pb.RepositoryModelUnloadRequest(model_name=model)
        response = pb.RepositoryModelUnloadResponse
        return _call("RepositoryModelUnload", message, response, _none, Retry.UNAVAILABLE)

    def infer(self, request: InferRequest) -> GrpcCall[InferResult]:
        message = encode_infer(request)
        return _call("ModelInfer", message, pb.ModelInferResponse, read_infer, Retry.UNAVAILABLE)


def _live(response: pb.ServerLiveResponse) -> bool:
    return response.live


def _ready(response: pb.ServerReadyResponse) -> bool:
    return response.ready


def _model_ready(response: pb.ModelReadyResponse) -> bool:
    return response.ready


def _none(_: Message) -> None:
    return None


def _server_metadata(response: pb.ServerMetadataResponse) -> ServerMetadata:
    return ServerMetadata(response.name, response.version, tuple(response.extensions))


def _model_metadata(response: pb.ModelMetadataResponse) -> ModelMetadata:
    def tensor(t: pb.ModelMetadataResponse.TensorMetadata) -> TensorMetadata:
        return TensorMetadata(t.name, t.datatype, tuple(t.shape))

    return ModelMetadata(
        name=response.name,
        versions=tuple(response.versions),
        platform=response.platform,
        inputs=tuple(tensor(t) for t in response.inputs),
        outputs=tuple(tensor(t) for t in response.outputs),
    )


def _config(response: pb.ModelConfigResponse) -> dict[str, Any]:
    return message_dict(response.config)


def _statistics(response: pb.ModelStatisticsResponse) -> list[dict[str, Any]]:
    return [message_dict(stats) for stats in response.model_stats]


def _index(response: pb.RepositoryIndexResponse) -> list[dict[str, Any]]:
    return [message_dict(model) for model in response.models]


def message_dict(message: Message) -> dict[str, Any]:
    """A message as the REST API writes it: proto field names, every field, and 64-bit
    integers as numbers (protobuf's JSON mapping writes them as strings)."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(cast(Descriptor, message.DESCRIPTOR), doc)
    return doc


def _int64_as_numbers(descriptor: Descriptor, doc: dict[str, Any]) -> None:
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        if field.type in _INT64:
            doc[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            values = field.message_type.fields_by_name["value"].message_type
            if values is not None:  # a map of messages (response_stats)
                for item in value.values():
                    _int64_as_numbers(values, item)
        elif field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(field.message_type, item)


def encode_infer(request: InferRequest) -> pb.ModelInferRequest:
    """The request message, every input's bytes in ``raw_input_contents``."""
    return pb.ModelInferRequest(
        model_name=request.model,
        model_version=request.version,
        id=request.id,
        parameters={key: _parameter(value) for key, value in request.parameters.items()},
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name=tensor.name, datatype=tensor.datatype, shape=tensor.array.shape
            )
            for tensor in request.inputs
        ],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in request.outputs],
        raw_input_contents=[to_bytes(t.array, t.datatype) for t in request.inputs],
    )


def _parameter(value: ParameterValue) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        if value >= 2**63:
            return pb.InferParameter(uint64_param=value)
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=value)


def read_infer(response: pb.ModelInferResponse) -> InferResult:
    """The outputs of an inference answer, raw ones as views of the message's bytes."""
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise InvalidResponse(f"{len(raw)} raw_output_contents for {len(response.outputs)} outputs")
    outputs: dict[str, Array] = {}
    for index, output in enumerate(response.outputs):
        shape = tuple(output.shape)
        if raw:
            outputs[output.name] = from_bytes(raw[index], output.datatype, shape)
        else:
            outputs[output.name] = _from_contents(output, shape)
    return InferResult(
        outputs,
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        parameters=_parameter_values(response.parameters),
    )


def _from_contents(
    output: pb.ModelInferResponse.InferOutputTensor, shape: tuple[int, ...]
) -> Array:
    field = _CONTENTS.get(output.datatype)
    if field is None:
        raise InvalidResponse(f"output '{output.name}': {output.datatype} needs raw contents")
    return from_json(list(getattr(output.contents, field)), output.datatype, shape)


def _parameter_values(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    return {key: _parameter_value(value) for key, value in parameters.items()}


def _parameter_value(parameter: pb.InferParameter) -> Any:
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)
