"""The batch sizes CUDA graphs and TensorRT profiles are planned around."""

from pathlib import Path

import pytest
from batchserve.backends.gpu_plan import (
    BatchRange,
    best_profile,
    graph_batch_sizes,
    padded_batch,
    plan_profiles,
    preferred_sizes,
)
from batchserve.core.errors import ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

MODEL = Path("repo/m/1/model.onnx")


def config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig(name="m"))


def test_preferred_sizes_are_sorted_unique_and_within_the_max() -> None:
    got = preferred_sizes(
        config("max_batch_size: 16 dynamic_batching { preferred_batch_size: [8, 2, 8, 32] }")
    )
    assert got == (2, 8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_batch_size: 16", ()),  # graphs off
        ("max_batch_size: 16 optimization { cuda { graphs: true } }", (16,)),
        (
            "max_batch_size: 16 dynamic_batching { preferred_batch_size: [8, 2] } "
            "optimization { cuda { graphs: true } }",
            (2, 8),
        ),
        (
            "max_batch_size: 16 dynamic_batching { preferred_batch_size: [8] } "
            "optimization { cuda { graphs: true graph_spec { batch_size: 4 } "
            "graph_spec { batch_size: 1 } } }",
            (1, 4),
        ),
        ("max_batch_size: 0 optimization { cuda { graphs: true } }", ()),  # no batch axis
    ],
)
def test_graph_sizes_come_from_graph_spec_then_preferred_then_max(
    text: str, expected: tuple[int, ...]
) -> None:
    assert graph_batch_sizes(config(text), MODEL) == expected


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("batch_size: 32", r"batch_size 32 is not within 1\.\.max_batch_size \(16\)"),
        ("batch_size: 0", "batch_size 0 is not within"),
        (
            'batch_size: 4 input { key: "x" value { dim: [3] } }',
            "input shapes or a graph_lower_bound is not supported",
        ),
        ("batch_size: 4 graph_lower_bound { batch_size: 1 }", "graph_lower_bound"),
    ],
)
def test_graph_specs_batchserve_cannot_honour_are_config_errors(spec: str, match: str) -> None:
    text = f"max_batch_size: 16 optimization {{ cuda {{ graphs: true graph_spec {{ {spec} }} }} }}"
    with pytest.raises(ModelConfigError, match=rf"model\.onnx: .*{match}"):
        graph_batch_sizes(config(text), MODEL)


@pytest.mark.parametrize(("batch", "expected"), [(1, 2), (2, 2), (3, 8), (8, 8), (9, None), (0, 2)])
def test_a_batch_pads_up_to_the_next_captured_size(batch: int, expected: int | None) -> None:
    assert padded_batch(batch, (8, 2)) == expected


def test_no_captured_sizes_means_no_padding() -> None:
    assert padded_batch(3, ()) is None


def test_profiles_split_the_batch_range_at_the_preferred_sizes() -> None:
    assert plan_profiles([16, 4, 4], 64) == (
        BatchRange(1, 4, 4),
        BatchRange(5, 16, 16),
        BatchRange(17, 64, 64),
    )


def test_a_preferred_size_equal_to_the_max_closes_the_range() -> None:
    assert plan_profiles([2, 8], 8) == (BatchRange(1, 2, 2), BatchRange(3, 8, 8))


def test_without_preferred_sizes_one_profile_tuned_for_the_max() -> None:
    (only,) = plan_profiles([], 32)
    assert only == BatchRange(1, 32, 32)
    assert only.covers(1)
    assert only.covers(32)
    assert not only.covers(33)


@pytest.mark.parametrize(("sizes", "cap"), [([0, 4], 8), ([9], 8), ([4], 0)])
def test_profile_sizes_outside_the_range_are_refused(sizes: list[int], cap: int) -> None:
    with pytest.raises(ValueError, match=r"not within|must be >= 1"):
        plan_profiles(sizes, cap)


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (3, 1),  # tuned for 4: the smallest opt at least the batch
        (4, 1),
        (5, 2),  # tuned for 16
        (40, 2),  # nothing tuned that large: the nearest below
        (1, 0),
    ],
)
def test_best_profile_prefers_the_smallest_opt_that_holds_the_batch(
    batch: int, expected: int
) -> None:
    candidates = [(0, 1), (1, 4), (2, 16)]
    assert best_profile(batch, candidates) == expected


def test_no_candidate_profile_means_none() -> None:
    assert best_profile(3, []) is None
