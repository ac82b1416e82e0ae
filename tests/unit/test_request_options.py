"""Request-level parameters with a meaning (priority, timeout, binary_data_output) split from
those passed through, and the reserved ones refused in Triton's words."""

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestOptions, request_options


def test_request_options_split_known_parameters() -> None:
    options = request_options(
        {"priority": 2, "timeout": 500, "binary_data_output": True, "custom": [1]}
    )
    assert (options.priority, options.timeout_us, options.binary_output) == (2, 500, True)
    assert options.parameters == {"custom": [1]}
    assert request_options({}) == RequestOptions(0, 0, False, {})


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        ({"priority": -1}, "'priority' must be an integer >= 0, got -1"),
        ({"priority": True}, "'priority' must be an integer >= 0, got true"),
        ({"priority": 1.0}, "'priority' must be an integer >= 0, got 1.0"),
        ({"timeout": "x"}, "'timeout' must be an integer >= 0, got 'x'"),
        ({"timeout": 2**64}, "'timeout' must be an integer >= 0"),
        ({"binary_data_output": 1}, "'binary_data_output' must be true or false, got 1"),
        ({"sequence_id": 7}, "'sequence_id': sequence batching is not supported"),
        ({"sequence_start": True}, "'sequence_start': sequence batching is not supported"),
        ({"sequence_end": False}, "'sequence_end': sequence batching is not supported"),
    ],
)
def test_request_options_rejected(parameters: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=f"request parameter {problem}"):
        request_options(parameters)


def test_request_parameters_named_triton_are_reserved_as_in_triton() -> None:
    with pytest.raises(InvalidArgument) as refused:
        request_options({"triton_final_response": True})
    assert refused.value.message.startswith(
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified."
    )
    assert request_options({"tritonic": 1}).parameters == {"tritonic": 1}
    # the reserved key Triton's own clients send (perf_analyzer over gRPC) is accepted
    sent = {"triton_enable_empty_final_response": True, "p": 2}
    assert request_options(sent).parameters == {"p": 2}
