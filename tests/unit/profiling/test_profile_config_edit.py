"""A setting written into config.pbtxt: only the three swept fields change, comments stay."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from batchserve.models.model_config import parse_pbtxt
from batchserve.profiling.config_edit import apply, current_setting, rewrite, write
from batchserve.profiling.plan import Setting, plan
from batchserve.proto.model_config_pb2 import ModelConfig, ModelDynamicBatching, ModelInstanceGroup

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


SHIPPED = sorted(MODEL_REPO.glob("*/config.pbtxt")) + sorted(MODEL_REPO.glob("*/configs/*"))

COMMENTED = """\
# digits, tuned by hand
name: "digits"  # the served name
max_batch_size: 64
instance_group [
  {
    kind: KIND_CPU
    rate_limiter { resources [{ name: "R1" count: 4 }] }  # not the instance count
  },
  { count: 3 kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [16, 32]
  default_queue_policy { max_queue_size: 256 }
}
model_warmup [{ name: "w" batch_size: 1 count: 5 inputs { key: "image" value {
  data_type: TYPE_FP32 dims: [1, 8, 8] zero_data: true } } }]
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
"""


COMMENTED_WRITTEN = """\
# digits, tuned by hand
name: "digits"  # the served name
max_batch_size: 8
instance_group [
  {
    kind: KIND_CPU
    rate_limiter { resources [{ name: "R1" count: 4 }] }  # not the instance count
    count: 2
  },
  { count: 2 kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [16, 32]
  default_queue_policy { max_queue_size: 256 }
  max_queue_delay_microseconds: 500
}
model_warmup [{ name: "w" batch_size: 1 count: 5 inputs { key: "image" value {
  data_type: TYPE_FP32 dims: [1, 8, 8] zero_data: true } } }]
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
"""


def swept_cleared(config: ModelConfig) -> ModelConfig:
    """The config without the fields a profile may change (or add: an instance group with
    only a count, a dynamic_batching block with only a delay)."""
    rest = ModelConfig()
    rest.CopyFrom(config)
    rest.ClearField("max_batch_size")
    rest.dynamic_batching.ClearField("max_queue_delay_microseconds")
    if rest.dynamic_batching == ModelDynamicBatching():
        rest.ClearField("dynamic_batching")
    for group in rest.instance_group:
        group.ClearField("count")
    kept = [group for group in rest.instance_group if group != ModelInstanceGroup()]
    del rest.instance_group[:]
    rest.instance_group.extend(kept)
    return rest


def assert_written(config: ModelConfig, setting: Setting) -> None:
    assert current_setting(config) == setting
    assert {group.count or 1 for group in config.instance_group} <= {setting.instances}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(MODEL_REPO).as_posix())
def test_every_other_field_of_a_shipped_config_survives(path: Path) -> None:
    """Every setting of the full sweep, sequence and decoupled models included."""
    text = path.read_text()
    before = parse_pbtxt(text)
    settings = plan(current_setting(before), quick=False)
    assert len(settings) >= 3
    for setting in settings:
        written, layout_kept = rewrite(text, setting)
        after = parse_pbtxt(written)
        assert layout_kept, setting
        assert after == apply(before, setting)
        assert swept_cleared(after) == swept_cleared(before)
        assert_written(after, setting)


def test_a_sequence_model_keeps_its_batcher_and_has_no_queue_delay() -> None:
    text = (MODEL_REPO / "char_lstm_step" / "config.pbtxt").read_text()
    before = parse_pbtxt(text)
    assert current_setting(before) == Setting(1, 64, None)
    written, layout_kept = rewrite(text, Setting(2, 8, None))
    after = parse_pbtxt(written)
    assert layout_kept
    assert not after.HasField("dynamic_batching")
    assert after.sequence_batching == before.sequence_batching
    assert (after.max_batch_size, after.instance_group[0].count) == (8, 2)


def test_comments_and_layout_survive_and_nested_counts_are_left_alone() -> None:
    written, layout_kept = rewrite(COMMENTED, Setting(2, 8, 500))
    assert layout_kept
    assert written == COMMENTED_WRITTEN
    after = parse_pbtxt(written)
    assert after.instance_group[0].rate_limiter.resources[0].count == 4
    assert after.model_warmup[0].count == 5
    assert swept_cleared(after) == swept_cleared(parse_pbtxt(COMMENTED))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "max_batch_size: 8\ninstance_group [{ count: 2 }]\n"
             "dynamic_batching { max_queue_delay_microseconds: 100 }\n"),
        ('name: "m"', 'name: "m"\nmax_batch_size: 8\ninstance_group [{ count: 2 }]\n'
                      "dynamic_batching { max_queue_delay_microseconds: 100 }\n"),
        ("dynamic_batching { }\nmax_batch_size: 4\ninstance_group { kind: KIND_CPU }",
         "dynamic_batching { max_queue_delay_microseconds: 100 }\nmax_batch_size: 8\n"
         "instance_group { kind: KIND_CPU count: 2 }\n"),
    ],
)  # fmt: skip
def test_missing_fields_are_added_in_place(text: str, expected: str) -> None:
    written, layout_kept = rewrite(text, Setting(2, 8, 100))
    assert layout_kept
    assert sorted(written.splitlines()) == sorted(expected.splitlines())
    assert parse_pbtxt(written) == apply(parse_pbtxt(text), Setting(2, 8, 100))


def test_a_model_that_does_not_batch_keeps_its_scheduling() -> None:
    config = parse_pbtxt('name: "fixed" instance_group [{ count: 2 }]')
    done = apply(config, Setting(3, 0, 0))
    assert not done.HasField("dynamic_batching")
    assert done.max_batch_size == 0
    assert [group.count for group in done.instance_group] == [3]


def test_one_instance_needs_no_group_and_an_unset_count_is_one() -> None:
    assert apply(ModelConfig(), Setting(1, 8, 0)).instance_group == []
    config = parse_pbtxt("instance_group [{ kind: KIND_CPU }, { count: 2 }]")
    assert current_setting(config).instances == 2
    assert [group.count for group in apply(config, Setting(1, 8, 0)).instance_group] == [0, 1]


def test_write_keeps_the_file_as_it_was_under_a_free_name(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text("max_batch_size: 64\n")
    path.chmod(0o640)
    assert write(path, "max_batch_size: 8\n") == tmp_path / "config.pbtxt.orig"
    assert write(path, "max_batch_size: 16\n") == tmp_path / "config.pbtxt.orig.1"
    assert path.read_text() == "max_batch_size: 16\n"
    assert (tmp_path / "config.pbtxt.orig").read_text() == "max_batch_size: 64\n"
    assert (tmp_path / "config.pbtxt.orig.1").read_text() == "max_batch_size: 8\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.pbtxt", "config.pbtxt.orig", "config.pbtxt.orig.1"
    ]  # fmt: skip


def test_write_without_a_file_there_keeps_nothing(tmp_path: Path) -> None:
    assert write(tmp_path / "config.pbtxt", "max_batch_size: 8\n") is None
    assert (tmp_path / "config.pbtxt").read_text() == "max_batch_size: 8\n"
