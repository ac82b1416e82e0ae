import numpy as np
import pytest
from batchserve.core import datatypes
from batchserve.core.errors import InvalidArgument
from batchserve.proto import model_config_pb2


def test_config_values_match_the_protobuf_enum() -> None:
    for dt in datatypes.BY_WIRE.values():
        proto_name = "TYPE_STRING" if dt.wire == "BYTES" else f"TYPE_{dt.wire}"
        assert model_config_pb2.DataType.Value(proto_name) == dt.config
        assert datatypes.config_name(dt.config) == proto_name


def test_unknown_wire_name_names_the_tensor() -> None:
    with pytest.raises(InvalidArgument, match=r"tensor 'x'.*'FP33'"):
        datatypes.from_wire("FP33", tensor="x")


@pytest.mark.parametrize(
    ("dtype", "wire"),
    [
        ("float32", "FP32"),
        ("int64", "INT64"),
        ("object", "BYTES"),
        ("S3", "BYTES"),
        ("bool", "BOOL"),
    ],
)
def test_numpy_dtypes_resolve(dtype: str, wire: str) -> None:
    assert datatypes.from_numpy(np.dtype(dtype)).wire == wire
