"""The head message reads every ModelInferRequest: same header, contents left as bytes."""

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.grpc.head import Head, contents_of, head_of
from batchserve.proto.grpc_service_pb2 import InferParameter, InferTensorContents, ModelInferRequest

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
