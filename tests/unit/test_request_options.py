"""Request-level parameters with a meaning (priority, timeout, binary_data_output) split from
those passed through, and the reserved ones refused in Triton's words."""

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestOptions, SequenceFlags, request_options


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
        (
            {"sequence_id": -1},
            "'sequence_id' must be an unsigned 64-bit integer or a string, got -1",
        ),
        ({"sequence_id": 2.0}, "'sequence_id' must be an unsigned 64-bit integer"),
        ({"sequence_id": True}, "'sequence_id' must be an unsigned 64-bit integer"),
        ({"sequence_id": "s" * 257}, "'sequence_id' is 257 characters long"),
        ({"sequence_id": 7, "sequence_start": 1}, "'sequence_start' must be true or false, got 1"),
        ({"sequence_id": 7, "sequence_end": "yes"}, "'sequence_end' must be true or false"),
    ],
)
def test_request_options_rejected(parameters: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=f"request parameter {problem}"):
        request_options(parameters)


def test_request_parameters_named_triton_are_reserved_as_in_triton() -> None:
    """Each protocol's words (L0_parameters' reserved-parameter test): over HTTP, no
    'triton_' key at all; over gRPC, all but triton_enable_empty_final_response."""
    for parameters in ({"triton_final_response": True},
                       {"triton_enable_empty_final_response": "dummy-value"}):  # fmt: skip
        with pytest.raises(InvalidArgument) as refused:
            request_options(parameters, http=True)
        assert refused.value.message.startswith(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified. (batchserve: "
        )
    with pytest.raises(InvalidArgument) as refused:
        request_options({"triton_final_response": True})
    assert refused.value.message.startswith(
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
        " (batchserve: "
    )
    assert request_options({"tritonic": 1}).parameters == {"tritonic": 1}
    # the reserved key Triton's own clients send (perf_analyzer over gRPC) is accepted
    sent = {"triton_enable_empty_final_response": True, "p": 2}
    assert request_options(sent).parameters == {"p": 2}
    assert request_options(sent).empty_final
    assert not request_options({"p": 2}).empty_final
    with pytest.raises(InvalidArgument, match="expected bool_param"):
        request_options({"triton_enable_empty_final_response": 1})


@pytest.mark.parametrize(
    ("parameters", "flags"),
    [
        ({"sequence_id": 7, "sequence_start": True}, SequenceFlags(7, start=True)),
        ({"sequence_id": 2**64 - 1, "sequence_end": True}, SequenceFlags(2**64 - 1, end=True)),
        ({"sequence_id": "user-42", "sequence_start": True, "sequence_end": True},
         SequenceFlags("user-42", start=True, end=True)),
        ({"sequence_id": 0, "sequence_start": True}, None),  # 0 and "" name no sequence
        ({"sequence_id": "", "sequence_end": False}, None),
    ],
)  # fmt: skip
def test_sequence_parameters_become_the_request_s_flags(
    parameters: dict[str, object], flags: SequenceFlags | None
) -> None:
    options = request_options({**parameters, "custom": 1})
    assert options.sequence == flags
    assert options.parameters == {"custom": 1}  # the sequence keys are taken out
