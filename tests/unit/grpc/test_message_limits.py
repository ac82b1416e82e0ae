"""Messages of the calls other than inference are measured before protobuf reads them."""

import grpc
import pytest
from batchserve.grpc.message_limits import (
    MAX_LOAD_FIELDS,
    MAX_MESSAGE_BYTES,
    MODEL_LOAD,
    Refusal,
    bounded,
)
from batchserve.grpc.wire import count_fields
from batchserve.proto import grpc_service_pb2 as pb
from google.protobuf.message import DecodeError

LOG_SETTINGS = "/inference.GRPCInferenceService/LogSettings"


def _load(files: int, size: int) -> bytes:
    parameters = {
        f"file:{i}/model.onnx": pb.ModelRepositoryParameter(bytes_param=bytes(size))
        for i in range(files)
    }
    parameters["config"] = pb.ModelRepositoryParameter(string_param="{}")
    request = pb.RepositoryModelLoadRequest(model_name="m", parameters=parameters)
    return request.SerializeToString()


def test_small_messages_are_parsed_as_the_call_parses_them() -> None:
    request = pb.LogSettingsRequest(
        settings={"log_info": pb.LogSettingsRequest.SettingValue(bool_param=True)}
    )
    data = request.SerializeToString()
    assert bounded(LOG_SETTINGS, pb.LogSettingsRequest.FromString)(data) == request
    assert bounded(LOG_SETTINGS, None)(data) is data  # a call that takes the bytes as they came


def test_a_message_over_the_limit_is_refused_unparsed() -> None:
    """Two 32 MiB LogSettings requests of empty entries held a server for 3.6 s and 880 MiB."""
    parsed: list[bytes] = []
    read = bounded(LOG_SETTINGS, parsed.append)
    assert read(b"\x0a\x00" * (MAX_MESSAGE_BYTES // 2)) is None  # at the limit: parsed
    refusal = read(b"\x0a\x00" * (MAX_MESSAGE_BYTES // 2 + 1))
    assert isinstance(refusal, Refusal)
    assert refusal.status is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refusal.message.startswith(
        f"Received message larger than max ({MAX_MESSAGE_BYTES + 2} vs. {MAX_MESSAGE_BYTES})"
    )
    assert "LogSettings" in refusal.message
    assert len(parsed) == 1


def test_a_model_load_takes_large_files_but_not_many_fields() -> None:
    read = bounded(MODEL_LOAD, pb.RepositoryModelLoadRequest.FromString)
    large = _load(files=3, size=100_000)
    request = read(large)
    assert isinstance(request, pb.RepositoryModelLoadRequest)
    assert len(request.parameters["file:2/model.onnx"].bytes_param) == 100_000
    crowded = b"\x1a\x00" * (MAX_MESSAGE_BYTES // 2 + 1)  # empty parameter entries
    assert count_fields(crowded, MAX_LOAD_FIELDS) == MAX_LOAD_FIELDS + 1  # counted no further
    refusal = read(crowded)
    assert isinstance(refusal, Refusal)
    assert refusal.status is grpc.StatusCode.INVALID_ARGUMENT
    assert f"more than {MAX_LOAD_FIELDS} fields" in refusal.message
    assert isinstance(
        read(_load(files=MAX_LOAD_FIELDS - 3, size=64)), pb.RepositoryModelLoadRequest
    )


def test_fields_are_counted_through_groups_and_framing_is_checked() -> None:
    group = b"\x4b" + b"\x08\x01" * 5 + b"\x4c"  # field 9 opens, five varints, field 9 ends
    assert count_fields(b"\x08\x01" + group + b"\x12\x01x", 100) == 9
    with pytest.raises(DecodeError):
        count_fields(b"\x12\x05abc", 100)  # a value past the end
    with pytest.raises(DecodeError):
        count_fields(b"\x4b\x08\x01", 100)  # a group that does not end
    with pytest.raises(DecodeError):
        count_fields(b"\x4c", 100)  # a group that ends without starting
