"""The head message reads every ModelInferRequest: same header, contents left as bytes."""

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import MAX_RANK, MAX_TENSORS
from batchserve.grpc.head import (
    MAX_FIELDS,
    SMALL_TENSOR_BYTES,
    VIEW_FROM,
    Head,
    contents_of,
    head_of,
    read,
)
from batchserve.proto.grpc_service_pb2 import InferParameter, InferTensorContents, ModelInferRequest
from google.protobuf.message import DecodeError

Input = ModelInferRequest.InferInputTensor
Output = ModelInferRequest.InferRequestedOutputTensor
PARAMETERS = {
    "flag": InferParameter(bool_param=True),
    "count": InferParameter(int64_param=-3),
    "size": InferParameter(uint64_param=2**64 - 1),
    "scale": InferParameter(double_param=0.5),
    "region": InferParameter(string_param="r"),
    "unset": InferParameter(),
}
TYPED = [
    InferTensorContents(bool_contents=[True, False]),
    InferTensorContents(int_contents=[-(2**31), 2**31 - 1]),
    InferTensorContents(int64_contents=[-(2**63), 2**63 - 1]),
    InferTensorContents(uint_contents=[0, 2**32 - 1]),
    InferTensorContents(uint64_contents=[0, 2**64 - 1]),
    InferTensorContents(fp32_contents=[1.5, -0.0]),
    InferTensorContents(fp64_contents=[1e300, float("inf")]),
    InferTensorContents(bytes_contents=[b"", b"a\x00b", b"\xff" * 300]),
    InferTensorContents(),
    InferTensorContents(int_contents=[1], fp32_contents=[2.0]),
]


def _typed_request() -> ModelInferRequest:
    inputs = [
        Input(name=f"in{i}", datatype="FP32", shape=[1, 2], parameters=PARAMETERS, contents=c)
        for i, c in enumerate(TYPED)
    ]
    inputs.append(Input(name="bare", datatype="INT8", shape=[0]))  # no contents at all
    outputs = [Output(name="y", parameters=PARAMETERS), Output(name="z")]
    return ModelInferRequest(
        model_name="m",
        model_version="2",
        id="request-1",
        parameters=PARAMETERS,
        inputs=inputs,
        outputs=outputs,
    )


def _raw_request() -> ModelInferRequest:
    inputs = [Input(name="a", datatype="FP32", shape=[2]), Input(name="b", datatype="BYTES")]
    return ModelInferRequest(
        model_name="m", inputs=inputs, raw_input_contents=[bytes(8), b"\x01\x00\x00\x00x"]
    )


@pytest.mark.parametrize("message", [_typed_request(), _raw_request()], ids=["typed", "raw"])
def test_the_head_reads_the_same_header_and_contents(message: ModelInferRequest) -> None:
    head = Head.FromString(message.SerializeToString())
    for field in ("model_name", "model_version", "id"):
        assert getattr(head, field) == getattr(message, field)
    assert dict(head.parameters) == dict(message.parameters)
    assert list(head.outputs) == list(message.outputs)
    assert list(head.raw_input_contents) == list(message.raw_input_contents)
    assert len(head.inputs) == len(message.inputs)
    for got, sent in zip(head.inputs, message.inputs, strict=True):
        assert (got.name, got.datatype, list(got.shape)) == (
            sent.name,
            sent.datatype,
            list(sent.shape),
        )
        assert dict(got.parameters) == dict(sent.parameters)
        assert got.HasField("contents") == sent.HasField("contents")
        assert contents_of(got) == sent.contents
    # the layout cache keys on the serialized header: the same bytes either way
    assert head.SerializeToString(deterministic=True) == message.SerializeToString(
        deterministic=True
    )


def test_head_of_converts_a_full_message_and_keeps_a_head() -> None:
    message = _typed_request()
    head = head_of(message)
    assert isinstance(head, Head)
    assert head_of(head) is head
    assert contents_of(head.inputs[7]).bytes_contents == TYPED[7].bytes_contents


def test_contents_that_are_no_message_are_refused_naming_the_input() -> None:
    head = Head(inputs=[Head.InferInputTensor(name="x", contents=b"\xff\xff\xff")])
    with pytest.raises(InvalidArgument, match="tensor 'x': contents is not a valid"):
        contents_of(head.inputs[0])


def _large_request(*entries: bytes) -> ModelInferRequest:
    inputs = [Input(name=f"in{i}", datatype="UINT8", shape=[len(e)]) for i, e in enumerate(entries)]
    outputs = [Output(name="y", parameters=PARAMETERS)]
    return ModelInferRequest(
        model_name="m", model_version="3", id="big", parameters=PARAMETERS, inputs=inputs,
        outputs=outputs, raw_input_contents=list(entries),
    )  # fmt: skip


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One field as it is written on the wire, for field numbers under 16 (one-byte tags);
    ``payload`` carries its own length where the wire type has one."""
    return bytes([number << 3 | wire_type]) + payload


def test_large_raw_contents_are_views_of_the_bytes_that_arrived() -> None:
    entries = (bytes(range(256)) * 200, b"\x07" * 70_000)
    data = _large_request(*entries).SerializeToString()
    assert len(data) >= VIEW_FROM
    request = read(data)
    assert all(isinstance(raw, memoryview) and raw.obj is data for raw in request.raw)
    assert [bytes(raw) for raw in request.raw] == list(entries)
    assert len(request.head.raw_input_contents) == 0
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "big")
    assert head_of(request) is request.head
    assert request.SerializeToString() is data  # forwarded as it came, not re-serialized
    whole = Head.FromString(data)
    del whole.raw_input_contents[:]
    assert request.head == whole


def test_raw_entries_anywhere_among_the_fields_and_unknown_fields_are_followed() -> None:
    first, second = b"\x01" * 40_000, b"\x02" * 3
    message = _large_request(first, second)
    raw = list(message.raw_input_contents)
    del message.raw_input_contents[:]
    known = message.SerializeToString()
    assert known[:3] == b"\x0a\x01m"  # model_name, a whole field
    unknown = (
        _field(10, 0, b"\x96\x01")  # varint
        + _field(11, 1, bytes(8))  # fixed 64
        + _field(12, 5, bytes(4))  # fixed 32
        + _field(13, 2, b"\x03abc")  # length-delimited
    )
    # the raw entries first, between the other fields, and last
    data = (
        _field(7, 2, b"\xc0\xb8\x02" + raw[0]) + known[:3] + unknown + known[3:]
        + _field(7, 2, b"\x03" + raw[1])
    )  # fmt: skip
    request = read(data)
    assert [bytes(r) for r in request.raw] == [first, second]
    assert request.head == Head.FromString(known[:3] + unknown + known[3:])


@pytest.mark.parametrize(
    "tail",
    [
        _field(7, 2, b"\xff\xff\x03"),  # an entry that runs past the end
        _field(9, 3, b"") + _field(9, 4, b""),  # a group: a wire type proto3 never writes
        _field(14, 0, b"\xff" * 11),  # a varint of more than 64 bits
    ],
    ids=["truncated", "group", "long-varint"],
)
def test_framing_is_read_as_protobuf_reads_it(tail: bytes) -> None:
    data = _large_request(b"\x05" * 40_000).SerializeToString() + tail
    try:
        expected: Head | None = Head.FromString(data)
    except DecodeError:
        expected = None
    if expected is None:
        with pytest.raises(DecodeError):
            read(data)
        return
    request = read(data)  # parsed whole: the contents copied out of the head
    assert [bytes(r) for r in request.raw] == list(expected.raw_input_contents)
    del expected.raw_input_contents[:]
    assert request.head == expected


def test_small_messages_are_parsed_whole() -> None:
    data = _raw_request().SerializeToString()
    assert len(data) < VIEW_FROM
    request = read(data)
    assert request.raw == list(_raw_request().raw_input_contents)
    assert all(isinstance(raw, bytes) for raw in request.raw)
    assert len(request.head.raw_input_contents) == 0


NAMES = _field(1, 2, b"\x01m") + _field(2, 2, b"\x013") + _field(3, 2, b"\x02id")
RAW = _field(7, 2, b"\x80\x80\x02" + bytes(32768))  # one raw entry: a message past VIEW_FROM


def _delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field, its length a varint of any size."""
    length, size = b"", len(payload)
    while size >= 0x80:
        length += bytes([size & 0x7F | 0x80])
        size >>= 7
    return _field(number, 2, length + bytes([size]) + payload)


def _refused(data: bytes, reason: str) -> None:
    """``data`` is refused before protobuf reads it: the head holds only its names."""
    assert len(data) >= VIEW_FROM
    request = read(data)
    assert request.refusal is not None
    assert reason in request.refusal
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "id")
    assert request.head == Head(model_name="m", model_version="3", id="id")
    with pytest.raises(InvalidArgument, match=reason.replace("(", r"\(").replace(")", r"\)")):
        head_of(request)


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        (_field(5, 2, b"\x00"), f"more than {MAX_FIELDS} fields"),  # empty inputs
        (_field(6, 2, b"\x00"), f"more than {MAX_FIELDS} fields"),  # empty outputs
        (_field(4, 2, b"\x00"), f"more than {MAX_FIELDS} fields"),  # empty parameters
        (_field(15, 0, b"\x00"), f"more than {MAX_FIELDS} fields"),  # an unknown field
        (_field(7, 2, b"\x00"), f"raw_input_contents has more than {MAX_TENSORS} entries"),
    ],
    ids=["inputs", "outputs", "parameters", "unknown", "raw"],
)
def test_millions_of_fields_are_refused_unparsed(field: bytes, reason: str) -> None:
    """16 M empty inputs (32 MiB) held a server for 15.7 s and 1.6 GiB while protobuf built
    them, before their count was refused."""
    _refused(NAMES + field * 2_000_000, reason)


def test_thousands_of_small_tensors_are_refused_with_their_count() -> None:
    tensor = Input(name="x", datatype="FP32", shape=[1]).SerializeToString()
    inputs = _field(5, 2, bytes([len(tensor)]) + tensor) * 3000
    _refused(NAMES + inputs, "request names 3000 inputs (at most 1024)")
    _refused(NAMES + _field(6, 2, b"\x03\x0a\x01y") * 2000 + RAW, "request names 2000 outputs")


def test_a_large_input_is_walked_field_by_field() -> None:
    entry = _field(4, 2, b"\x03\x0a\x01k")  # a parameter "k" with no value
    name = _field(1, 2, b"\x01x")
    crowded = _delimited(5, name + entry * 4000)  # 4,001 fields in one input
    _refused(NAMES + crowded * 17, f"more than {MAX_FIELDS} fields")
    accepted = NAMES + crowded * 3 + RAW
    request = read(accepted)
    assert request.refusal is None
    assert len(request.head.inputs) == 3
    assert len(request.head.inputs[0].parameters) == 1  # a map: 4,000 entries of one key


@pytest.mark.parametrize("dims", [MAX_RANK, MAX_RANK + 1])
def test_a_packed_shape_longer_than_max_rank_dimensions_can_be_is_refused(dims: int) -> None:
    """Each dimension is a varint of at most 10 bytes (a negative one takes 10)."""
    minus_one = b"\xff" * 9 + b"\x01"
    data = NAMES + _delimited(5, _field(1, 2, b"\x01x") + _delimited(3, minus_one * dims)) + RAW
    if dims > MAX_RANK:
        _refused(data, f"shape has more than {MAX_RANK} dimensions")
        return
    request = read(data)
    assert request.refusal is None
    assert list(request.head.inputs[0].shape) == [-1] * MAX_RANK


def test_groups_are_followed_as_protobuf_follows_them() -> None:
    """proto3 never writes groups, but protobuf reads them as unknown fields: the scan must
    neither give up on them nor take a raw_input_contents inside one for the message's."""
    group = _field(9, 3, b"") + _field(7, 2, b"\x02ab") + _field(10, 3, b"") + _field(10, 4, b"")
    group += _field(9, 4, b"")
    padding = _field(11, 2, b"\x01x") * 50
    tensor = _field(1, 2, b"\x01x") + group + padding
    assert len(tensor) > SMALL_TENSOR_BYTES  # walked
    data = NAMES + group + _delimited(5, tensor) + RAW
    expected = Head.FromString(data)
    request = read(data)
    assert [bytes(raw) for raw in request.raw] == list(expected.raw_input_contents)
    assert len(request.raw) == 1
    del expected.raw_input_contents[:]
    assert request.head == expected
    unmatched = NAMES + _field(9, 3, b"") + _field(8, 4, b"") + bytes(VIEW_FROM)
    with pytest.raises(DecodeError):
        Head.FromString(unmatched)
    with pytest.raises(DecodeError):
        read(unmatched)
