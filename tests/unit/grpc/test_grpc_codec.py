import struct
from typing import Any

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.errors import Internal, InvalidArgument
from batchserve.core.tensors import array_from_bytes, array_to_bytes
from batchserve.core.types import InferResponse, RequestedOutput, Tensor
from batchserve.grpc.codec import CONTENTS_FIELD, decode_infer_request, encode_infer_response
from batchserve.proto.grpc_service_pb2 import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferResponse,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

Input = ModelInferRequest.InferInputTensor
Output = ModelInferRequest.InferRequestedOutputTensor
FP32, BYTES = BY_WIRE["FP32"], BY_WIRE["BYTES"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def fp32_input(name: str = "x", shape: tuple[int, ...] = (1, 2), **fields: Any) -> Input:
    return Input(name=name, shape=shape, **{"datatype": "FP32", **fields})


def raw_request(*inputs: Input, raw: list[bytes], **fields: Any) -> ModelInferRequest:
    return ModelInferRequest(model_name="m", inputs=inputs, raw_input_contents=raw, **fields)


def over_the_wire(message: ModelInferRequest) -> ModelInferRequest:
    return ModelInferRequest.FromString(message.SerializeToString())


def object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


@st.composite
def arrays(draw: st.DrawFn) -> tuple[DataType, np.ndarray]:
    datatype = draw(st.sampled_from(list(BY_WIRE.values())))
    shape = draw(SHAPES)
    if datatype.wire == "BYTES":
        count = int(np.prod(shape))
        items = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        return datatype, object_array(items, shape)
    return datatype, draw(hnp.arrays(datatype.numpy, shape))


def equal(got: np.ndarray, sent: np.ndarray) -> bool:
    if sent.dtype == object:
        return got.shape == sent.shape and got.ravel().tolist() == sent.ravel().tolist()
    return got.dtype == sent.dtype and got.shape == sent.shape and got.tobytes() == sent.tobytes()


# --- requests --------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(arrays(), min_size=1, max_size=4))
def test_raw_input_contents_decode_to_the_same_arrays(cases: list[tuple[DataType, Any]]) -> None:
    inputs = [
        Input(name=f"in{i}", datatype=dt.wire, shape=array.shape)
        for i, (dt, array) in enumerate(cases)
    ]
    raw = [bytes(array_to_bytes(array, dt)) for dt, array in cases]
    request = decode_infer_request(over_the_wire(raw_request(*inputs, raw=raw)))
    for tensor, (datatype, array) in zip(request.inputs, cases, strict=True):
        assert tensor.datatype == datatype
        assert tensor.shape == array.shape
        assert equal(tensor.data, array)


@settings(max_examples=80, deadline=None)
@given(arrays().filter(lambda case: case[0].wire not in ("FP16", "BF16")))
def test_typed_contents_decode_to_the_same_arrays(case: tuple[DataType, np.ndarray]) -> None:
    datatype, array = case
    contents = InferTensorContents(**{CONTENTS_FIELD[datatype.wire]: array.ravel().tolist()})
    message = ModelInferRequest(
        inputs=[Input(name="x", datatype=datatype.wire, shape=array.shape, contents=contents)]
    )
    tensor = decode_infer_request(over_the_wire(message)).inputs[0]
    assert tensor.data.dtype == array.dtype
    assert tensor.data.shape == array.shape
    # NaN payloads may change on the way through Python floats; values may not
    assert np.array_equal(tensor.data, array, equal_nan=array.dtype.kind == "f")


def test_request_fields_are_decoded() -> None:
    message = raw_request(
        fp32_input(),
        raw=[np.zeros(2, dtype=np.float32).tobytes()],
        model_version="3",
        id="abc",
        parameters={
            "priority": InferParameter(uint64_param=2),
            "timeout": InferParameter(int64_param=500),
            "custom": InferParameter(string_param="v"),
            "flag": InferParameter(bool_param=True),
            "unset": InferParameter(),
        },
        outputs=[Output(name="y"), Output(name="z")],
    )
    request = decode_infer_request(over_the_wire(message))
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "abc")
    assert (request.priority, request.timeout_us) == (2, 500)
    assert request.parameters == {"custom": "v", "flag": True, "unset": None}
    assert request.outputs == [RequestedOutput("y"), RequestedOutput("z")]


def test_classification_is_read_as_tritonclient_writes_it() -> None:
    # tritonclient.grpc's InferRequestedOutput(class_count=4) sets exactly this int64_param
    classified = Output(name="y", parameters={"classification": InferParameter(int64_param=4)})
    message = raw_request(fp32_input(), raw=[F8], outputs=[classified, Output(name="z")])
    request = decode_infer_request(over_the_wire(message))
    assert request.outputs is not None
    assert [(o.name, o.classification) for o in request.outputs] == [("y", 4), ("z", 0)]


def test_no_requested_outputs_means_every_output() -> None:
    message = raw_request(fp32_input(), raw=[bytes(8)])
    assert decode_infer_request(message).outputs is None


def test_no_inputs_decode_for_validation_to_judge() -> None:
    """A model whose inputs are all optional takes a request with none (validation decides)."""
    assert decode_infer_request(ModelInferRequest(model_name="m")).inputs == []


def test_zero_element_input_needs_no_contents() -> None:
    message = ModelInferRequest(inputs=[fp32_input(shape=(0, 2))])
    assert decode_infer_request(message).inputs[0].data.shape == (0, 2)


def test_bytes_contents_keep_nul_and_non_utf8() -> None:
    contents = InferTensorContents(bytes_contents=[b"", b"a\x00b", b"\xff"])
    message = ModelInferRequest(
        inputs=[Input(name="s", datatype="BYTES", shape=[3], contents=contents)]
    )
    assert decode_infer_request(message).inputs[0].data.tolist() == [b"", b"a\x00b", b"\xff"]


def typed(wire: str, shape: list[int], **contents: Any) -> Input:
    return Input(name="x", datatype=wire, shape=shape, contents=InferTensorContents(**contents))


def case(message: ModelInferRequest, problem: str) -> Any:
    return pytest.param(message, problem, id=problem[:40])


F8 = bytes(8)
MALFORMED = [
    case(raw_request(Input(datatype="FP32", shape=[1]), raw=[bytes(4)]), r"inputs\[0\]: 'name'"),
    case(raw_request(fp32_input(datatype="FP33"), raw=[F8]), "tensor 'x': unknown datatype 'FP33'"),
    case(
        raw_request(fp32_input(), fp32_input(), raw=[F8, F8]),
        "^input 'x' already exists in request",
    ),
    case(
        raw_request(fp32_input(), raw=[F8], outputs=[Output(name="y"), Output(name="y")]),
        "^output 'y' already exists in request",
    ),
    case(raw_request(fp32_input(), raw=[F8], outputs=[Output()]), r"outputs\[0\]: 'name'"),
    # rows 9, 10: shapes
    case(
        raw_request(fp32_input(shape=(2, -5)), raw=[F8]),
        r"^All input dimensions should be specified for input 'x', got \[2, -5\]",
    ),
    case(
        raw_request(fp32_input(shape=(2**32, 2**32)), raw=[b""]),
        "invalid shape for input 'x': shape .* causes total element count to exceed maximum",
    ),
    case(
        raw_request(fp32_input(shape=(4, 2**60 + 2)), raw=[b""]),
        r"byte size overflow for input 'x': element count \(4611686018427387912\) \* data type",
    ),
    case(raw_request(fp32_input(shape=(1, 2**40)), raw=[b""]), "tensor 'x': shape dimension"),
    case(raw_request(fp32_input(shape=(2**30, 2**30)), raw=[b""]), "tensor 'x': shape .* elements"),
    case(raw_request(fp32_input(shape=(2**29, 2)), raw=[b""]), "tensor 'x': .* bytes \\(at most"),
    # row 11: typed element count
    case(ModelInferRequest(inputs=[typed("FP32", [3], fp32_contents=[1, 2])]), "contents has 2"),
    case(
        ModelInferRequest(inputs=[fp32_input()]),
        r"tensor 'x': contents has 0 elements, shape \[1, 2\]",
    ),
    # typed contents in the wrong field, or for FP16/BF16
    case(
        ModelInferRequest(inputs=[typed("FP32", [1], int_contents=[1])]),
        "tensor 'x': FP32 data belongs in contents.fp32_contents, got contents.int_contents",
    ),
    case(
        ModelInferRequest(inputs=[typed("FP16", [1], fp32_contents=[1])]),
        "tensor 'x': FP16 data must be sent in raw_input_contents",
    ),
    case(ModelInferRequest(inputs=[typed("BF16", [1])]), "BF16 data must be sent in raw_input"),
    case(
        ModelInferRequest(inputs=[typed("INT8", [1], int_contents=[300])]),
        "tensor 'x': a value is out of range for INT8",
    ),
    case(
        ModelInferRequest(inputs=[typed("UINT16", [1], uint_contents=[70000])]),
        "tensor 'x': a value is out of range for UINT16",
    ),
    # row 16: raw size
    case(
        raw_request(fp32_input(shape=(1, 8)), raw=[bytes(40)]),
        r"^input byte size mismatch for input 'x' for model 'm'\. Expected 32, got 40 "
        r"\(batchserve: "
        "shape",
    ),
    # row 19: both kinds of contents
    case(
        raw_request(typed("FP32", [1], fp32_contents=[1.0]), raw=[bytes(4)]),
        "^contents field must not be specified when using raw_input_contents for 'x' "
        "for model 'm' \\(batchserve",
    ),
    # row 20: raw count
    case(
        raw_request(fp32_input("a"), fp32_input("b"), raw=[F8]),
        "raw_input_contents has 1 entries but the request has 2 inputs",
    ),
    case(raw_request(fp32_input(), raw=[F8, F8]), "raw_input_contents has 2 entries"),
    # row 21: BYTES framing
    case(
        raw_request(
            Input(name="s", datatype="BYTES", shape=[1]), raw=[struct.pack("<I", 9) + b"a"]
        ),
        r"^string element 0 has length 9 for inference input 's' for model 'm', but only 1 bytes",
    ),
    case(
        raw_request(
            Input(name="s", datatype="BYTES", shape=[1]), raw=[struct.pack("<I", 1) + b"ab"]
        ),
        "^incomplete string length indicator for inference input 's' for model 'm', expecting 4 "
        "bytes but only 1 bytes available",
    ),
    # row 27: parameters
    case(
        raw_request(
            fp32_input(), raw=[F8], parameters={"priority": InferParameter(int64_param=-1)}
        ),
        "request parameter 'priority' must be an integer >= 0, got -1",
    ),
    case(
        raw_request(
            fp32_input(), raw=[F8], parameters={"priority": InferParameter(bool_param=True)}
        ),
        "request parameter 'priority' must be an integer >= 0, got true",
    ),
    case(
        raw_request(
            fp32_input(), raw=[F8], parameters={"timeout": InferParameter(string_param="x")}
        ),
        "request parameter 'timeout' must be an integer >= 0, got 'x'",
    ),
    case(
        raw_request(
            fp32_input(), raw=[F8], parameters={"timeout": InferParameter(double_param=1.0)}
        ),
        "request parameter 'timeout' must be an integer >= 0, got 1.0",
    ),
    case(
        raw_request(
            fp32_input(), raw=[F8], parameters={"sequence_id": InferParameter(double_param=4.0)}
        ),
        "request parameter 'sequence_id' must be an unsigned 64-bit integer or a string, got 4.0",
    ),
    # row 28: too many tensors
    case(
        raw_request(fp32_input(), raw=[F8], outputs=[Output(name=f"o{i}") for i in range(10_000)]),
        "request names 10000 outputs",
    ),
    case(
        ModelInferRequest(inputs=[fp32_input(f"i{i}") for i in range(1025)]),
        "request names 1025 inputs",
    ),
    # extensions batchserve does not serve
    # shared memory: parameters checked as Triton's ParseSharedMemoryParams does
    case(
        raw_request(
            fp32_input(
                parameters={
                    "shared_memory_region": InferParameter(string_param="r"),
                    "shared_memory_byte_size": InferParameter(int64_param=8),
                }
            ),
            raw=[F8],
        ),
        "tensor 'x': has both 'shared_memory_region' and data",
    ),
    case(
        ModelInferRequest(
            inputs=[fp32_input(parameters={"shared_memory_region": InferParameter(int64_param=1)})]
        ),
        "invalid value type for 'shared_memory_region' parameter for tensor 'x'",
    ),
    # the classification extension: int64_param >= 1, as Triton reads it
    *(
        case(
            raw_request(
                fp32_input(), raw=[F8], outputs=[Output(name="y", parameters={"classification": p})]
            ),
            problem,
        )
        for p, problem in (
            (InferParameter(int64_param=0), "expected >= 0: output 'y': .* got 0$"),
            (InferParameter(int64_param=-2), "expected >= 0: output 'y': .* got -2$"),
            (InferParameter(uint64_param=3), "type for 'classification' parameter, expected int64"),
            (
                InferParameter(string_param="3"),
                "type for 'classification' parameter, expected int64",
            ),
            (InferParameter(), "invalid value type for 'classification' parameter"),
        )
    ),
]


@pytest.mark.parametrize(("message", "problem"), MALFORMED)
def test_malformed_requests_are_invalid_arguments(message: ModelInferRequest, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        decode_infer_request(over_the_wire(message))


# --- responses -------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(arrays(), min_size=1, max_size=4))
def test_responses_carry_every_output_in_raw_output_contents(
    cases: list[tuple[DataType, np.ndarray]],
) -> None:
    outputs = [Tensor(f"o{i}", dt, array.shape, array) for i, (dt, array) in enumerate(cases)]
    message = encode_infer_response(InferResponse("m", "1", "r", outputs))
    message = ModelInferResponse.FromString(message.SerializeToString())
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r")
    assert len(message.raw_output_contents) == len(cases)
    for output, raw, (datatype, array) in zip(
        message.outputs, message.raw_output_contents, cases, strict=True
    ):
        assert output.datatype == datatype.wire
        assert tuple(output.shape) == array.shape
        assert not output.HasField("contents")
        assert equal(array_from_bytes(raw, datatype, array.shape, tensor="y"), array)


def test_bytes_outputs_are_length_prefixed() -> None:
    data = object_array([b"ab", b""], (2,))
    message = encode_infer_response(InferResponse("m", "1", "", [Tensor("s", BYTES, (2,), data)]))
    assert message.raw_output_contents[0] == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


def test_response_parameters_keep_their_type() -> None:
    output = Tensor("y", FP32, (1,), np.ones(1, dtype=np.float32), {"note": "n"})
    response = InferResponse(
        "m", "1", "", [output], {"b": True, "i": -3, "u": 2**63, "f": 0.5, "s": "x"}
    )
    message = encode_infer_response(response)
    kinds = {key: p.WhichOneof("parameter_choice") for key, p in message.parameters.items()}
    assert kinds == {
        "b": "bool_param",
        "i": "int64_param",
        "u": "uint64_param",
        "f": "double_param",
        "s": "string_param",
    }
    assert message.parameters["u"].uint64_param == 2**63
    assert message.outputs[0].parameters["note"].string_param == "n"


def test_response_parameter_without_a_grpc_form_is_an_internal_error() -> None:
    response = InferResponse("m", "1", "", [], {"bad": [1, 2]})
    with pytest.raises(Internal, match="response parameter 'bad' of type list"):
        encode_infer_response(response)


def shm_parameters(region: str, size: int) -> dict[str, InferParameter]:
    return {
        "shared_memory_region": InferParameter(string_param=region),
        "shared_memory_byte_size": InferParameter(int64_param=size),
    }


def test_inputs_in_shared_memory_take_no_raw_input_contents_entry() -> None:
    # as Triton reads it: the raw entries belong, in order, to the inputs not in a region
    message = raw_request(
        fp32_input("a", parameters=shm_parameters("r", 8)),
        fp32_input("b"),
        raw=[np.array([[1.0, 2.0]], np.float32).tobytes()],
    )
    request = decode_infer_request(over_the_wire(message))
    shared, plain = request.inputs
    assert shared.parameters["shared_memory_region"] == "r"
    assert shared.data.shape == (1, 2)  # a placeholder until the dataplane reads the region
    assert plain.data.tolist() == [[1.0, 2.0]]


def test_outputs_in_shared_memory_have_an_empty_raw_entry() -> None:
    shared = Tensor("s", FP32, (1, 2), np.ones((1, 2), np.float32), {}, True)
    plain = Tensor("p", FP32, (1, 2), np.ones((1, 2), np.float32))
    message = encode_infer_response(InferResponse("m", "1", "", [shared, plain]))
    assert message.raw_output_contents[0] == b""
    assert message.raw_output_contents[1] == np.ones(2, np.float32).tobytes()
    assert [tuple(o.shape) for o in message.outputs] == [(1, 2), (1, 2)]
