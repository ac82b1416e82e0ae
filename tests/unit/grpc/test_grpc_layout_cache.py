"""gRPC requests that repeat a layout: decoded once, then only viewed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.grpc import codec, layout_cache
from batchserve.grpc.head import VIEW_FROM, read
from batchserve.grpc.layout_cache import MAX_KEY_BYTES, MessageLayouts
from batchserve.proto.grpc_service_pb2 import InferParameter, ModelInferRequest
from decoding import assert_same_request, count_full_decodes

Input = ModelInferRequest.InferInputTensor
Output = ModelInferRequest.InferRequestedOutputTensor


def _message(x: np.ndarray, n: np.ndarray, **fields: Any) -> ModelInferRequest:
    """As it arrives: parsed from the bytes a client sent."""
    sent = ModelInferRequest(
        model_name="m",
        model_version="1",
        inputs=[
            Input(name="x", datatype="FP32", shape=x.shape),
            Input(name="n", datatype="INT64", shape=n.shape),
        ],
        outputs=[Output(name="y")],
        raw_input_contents=[x.tobytes(), n.tobytes()],
        **fields,
    )
    return ModelInferRequest.FromString(sent.SerializeToString())


@pytest.fixture
def full_decodes(monkeypatch: pytest.MonkeyPatch) -> list[ModelInferRequest]:
    return count_full_decodes(monkeypatch, layout_cache)


def test_a_repeated_layout_decodes_as_the_full_decoder_would(
    full_decodes: list[ModelInferRequest],
) -> None:
    layouts = MessageLayouts()
    rng = np.random.default_rng(0)
    for index in range(3):  # new values and ids, same layout
        x = rng.random((2, 3), dtype=np.float32)
        n = rng.integers(0, 9, (2, 1)).astype(np.int64)
        fields = {"id": f"r{index}", "parameters": {"priority": InferParameter(uint64_param=2)}}
        got = layouts.decode(_message(x, n, **fields))
        assert_same_request(got, codec.decode_infer_request(_message(x, n, **fields)))
        assert got.id == f"r{index}"
        assert got.priority == 2
        np.testing.assert_array_equal(got.inputs[0].data, x)
        np.testing.assert_array_equal(got.inputs[1].data, n)
        assert got.layout is not None
    assert len(full_decodes) == 1
    assert full_decodes[0].id == "r0"  # the message the decoder saw had its id again
    # and its raw contents were handed over as read: putting them back would copy them
    assert len(full_decodes[0].raw_input_contents) == 0


def test_parameters_and_sizes_are_part_of_the_layout(
    full_decodes: list[ModelInferRequest],
) -> None:
    layouts = MessageLayouts()
    x, n = np.ones((1, 3), np.float32), np.ones((1, 1), np.int64)
    for priority in (1, 2, 1, 2):
        request = layouts.decode(
            _message(x, n, parameters={"priority": InferParameter(uint64_param=priority)})
        )
        assert request.priority == priority
    assert len(full_decodes) == 2
    bigger = layouts.decode(_message(np.ones((2, 3), np.float32), np.ones((2, 1), np.int64)))
    assert bigger.inputs[0].shape == (2, 3)
    assert len(full_decodes) == 3


def test_raw_contents_of_the_wrong_size_fail_every_time(
    full_decodes: list[ModelInferRequest],
) -> None:
    layouts = MessageLayouts()
    good = _message(np.ones((1, 3), np.float32), np.ones((1, 1), np.int64))
    layouts.decode(good)
    for _ in range(2):
        short = _message(np.ones((1, 3), np.float32), np.ones((1, 1), np.int64))
        short.raw_input_contents[0] = bytes(8)
        with pytest.raises(
            InvalidArgument,
            match=r"^input byte size mismatch for input 'x' for model 'm'\. Expected 12",
        ):
            layouts.decode(short)
    assert len(full_decodes) == 3
    assert len(layouts) == 1


def test_typed_contents_and_bytes_take_the_full_decoder(
    full_decodes: list[ModelInferRequest],
) -> None:
    layouts = MessageLayouts()

    def typed() -> ModelInferRequest:
        contents = {"fp32_contents": [1, 2]}
        tensor = Input(name="x", datatype="FP32", shape=[1, 2], contents=contents)
        return ModelInferRequest(model_name="m", inputs=[tensor])

    def strings() -> ModelInferRequest:
        return ModelInferRequest(
            model_name="m",
            inputs=[Input(name="s", datatype="BYTES", shape=[1])],
            raw_input_contents=[b"\2\0\0\0hi"],
        )

    for message in (typed, strings, typed, strings):  # each call has its own message
        assert layouts.decode(message()).layout is None
    assert len(full_decodes) == 4
    assert len(layouts) == 0


def test_messages_with_a_long_rest_are_not_kept(full_decodes: list[ModelInferRequest]) -> None:
    layouts = MessageLayouts()
    long = {"note": InferParameter(string_param="n" * MAX_KEY_BYTES)}
    for _ in range(2):
        message = _message(np.ones((1, 3), np.float32), np.ones((1, 1), np.int64), parameters=long)
        request = layouts.decode(message)
        assert request.parameters == {"note": "n" * MAX_KEY_BYTES}
        assert request.layout is None
    assert len(full_decodes) == 2
    assert len(layouts) == 0


def test_layouts_kept_are_bounded(full_decodes: list[ModelInferRequest]) -> None:
    layouts = MessageLayouts(entries=2)
    for rows in range(1, 6):
        layouts.decode(_message(np.ones((rows, 3), np.float32), np.ones((rows, 1), np.int64)))
    assert len(layouts) == 2


def _viewed(array: np.ndarray) -> object:
    """What an array's memory belongs to, through the views over it."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_large_requests_off_the_wire_decode_to_views_of_the_bytes_that_arrived() -> None:
    layouts = MessageLayouts()
    rng = np.random.default_rng(1)
    for index in range(2):  # the full decoder, then the layout's views
        x = rng.random((64, 160), dtype=np.float32)  # 40 KiB: over head.VIEW_FROM
        n = rng.integers(0, 9, (64, 1)).astype(np.int64)
        data = _message(x, n, id=f"r{index}").SerializeToString()
        assert len(data) >= VIEW_FROM
        request = read(data)
        got = layouts.decode(request)
        assert_same_request(got, codec.decode_infer_request(_message(x, n, id=f"r{index}")))
        assert got.layout is not None
        assert all(_viewed(t.data) is data for t in got.inputs)  # not copied
        assert request.id == f"r{index}"  # kept for a stream's error answer
