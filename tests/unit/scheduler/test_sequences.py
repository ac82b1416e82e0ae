"""The sequence batcher over a real ONNX accumulator with implicit state and controls."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.core.errors import Cancelled, InvalidArgument, Overloaded, Unavailable
from batchserve.core.types import SequenceFlags
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.sequences import Control, SequenceBatcher, SequencePolicy
from batchserve.scheduler.work import WorkItem
from batchserve.zoo.sequence_models import accumulator_nodes
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.anyio

CONFIG = """
name: "acc" max_batch_size: 8
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] },
        { name: "ID" data_type: TYPE_INT64 dims: [1] },
        { name: "ENDED" data_type: TYPE_INT32 dims: [1] }]
sequence_batching {
  max_sequence_idle_microseconds: 50000
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
    { name: "END" control [{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }] },
    { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] },
    { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 }] }
  ]
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1] }]
}
"""


@pytest.fixture
def accumulator(tmp_path: Path) -> Path:
    """OUTPUT = ACC_OUT = ACC_IN * (1 - START) + INPUT * READY; ID = CORRID; ENDED = END."""
    nodes, constants = accumulator_nodes()
    nodes += [
        helper.make_node("Identity", ["CORRID"], ["ID"]),
        helper.make_node("Identity", ["END"], ["ENDED"]),
    ]
    int32 = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
             for n in ("INPUT", "START", "END", "READY", "ACC_IN")]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "accumulator",
        [*int32, helper.make_tensor_value_info("CORRID", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
         for n in ("OUTPUT", "ACC_OUT", "ENDED")]
        + [helper.make_tensor_value_info("ID", TensorProto.INT64, ["batch", 1])],
        constants,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "accumulator.onnx"
    onnx.save(model, str(path))
    return path


class Harness:
    def __init__(self, model_file: Path, *, hold: tuple[int, int] = (0, 0)) -> None:
        """``hold``: the server's ``--delay-scheduler`` and ``--backlog-delay-scheduler``."""
        config = parse_pbtxt(CONFIG)
        self.backend = OnnxBackend()
        self.backend.load(model_file, config, CPU)
        sequences = SequencePolicy.from_config(config)
        assert sequences is not None
        policy = BatchPolicy.from_config(
            config, 64, delay_scheduler=hold[0], backlog_delay_scheduler=hold[1]
        )
        self.batcher = SequenceBatcher(
            "acc", InstancePool([Instance("acc-0", self.backend)]), policy, ModelStats(), sequences
        )

    def step(
        self,
        sequence_id: int | str,
        value: int,
        *,
        start: bool = False,
        end: bool = False,
        timeout_s: float | None = None,
    ) -> WorkItem:
        item = WorkItem(
            inputs={"INPUT": np.array([[value]], np.int32)},
            batch_size=1,
            output_names=("OUTPUT", "ID", "ENDED"),
            priority=1,
            enqueued_ns=0,
            deadline_ns=None if timeout_s is None else time.monotonic_ns() + int(timeout_s * 1e9),
            future=asyncio.get_running_loop().create_future(),
            sequence=SequenceFlags(sequence_id, start, end),
        )
        self.batcher.submit(item)
        return item


async def _outputs(item: WorkItem) -> tuple[int, int, int]:
    out = await asyncio.wait_for(item.future, 5)
    assert set(out) == {"OUTPUT", "ID", "ENDED"}  # the state output is kept, not answered
    return int(out["OUTPUT"][0, 0]), int(out["ID"][0, 0]), int(out["ENDED"][0, 0])


async def test_interleaved_sequences_each_keep_their_own_state(accumulator: Path) -> None:
    harness = Harness(accumulator)
    first = [harness.step(11, 1, start=True), harness.step(22, 100, start=True)]
    assert [await _outputs(i) for i in first] == [(1, 11, 0), (100, 22, 0)]
    assert all(i.dispatched_ns > 0 for i in first)  # the step's dispatch: the queue time ends
    second = [harness.step(22, 5), harness.step(11, 2), harness.step(11, 3, end=True)]
    results = [await _outputs(i) for i in second]
    assert results == [(105, 22, 0), (3, 11, 0), (6, 11, 1)]
    assert harness.batcher.live == 1  # 11 ended; 22 goes on
    assert harness.batcher.stats.execution_count < harness.batcher.stats.inference_count


async def test_steps_of_one_sequence_run_in_order_even_when_sent_at_once(
    accumulator: Path,
) -> None:
    harness = Harness(accumulator)
    items = [harness.step(77, n, start=n == 1) for n in range(1, 6)]
    assert [(await _outputs(i))[0] for i in items] == [1, 3, 6, 10, 15]


async def test_an_id_of_the_other_kind_than_the_corrid_control_is_refused_in_tritons_words(
    accumulator: Path,
) -> None:
    """L0_sequence_corrid_batcher's data-type test: a string id to an integer CORRID, and an
    integer id to a string one (which used to be taken as its text)."""
    harness = Harness(accumulator)
    with pytest.raises(InvalidArgument) as refused:
        harness.step("text-1", 1, start=True)
    assert refused.value.message.startswith(
        "sequence batching control 'CORRID' data-type is 'BYTES', but model 'acc' expects 'INT64'"
    )
    string_id = Control("CORRID", "CORRID", np.dtype(object))
    harness.batcher.sequences = replace(harness.batcher.sequences, controls=(string_id,))
    with pytest.raises(InvalidArgument) as refused:
        harness.step(7, 1, start=True)
    assert refused.value.message.startswith(
        "sequence batching control 'CORRID' data-type is 'UINT64', but model 'acc' expects 'BYTES'"
    )
    assert harness.batcher.live == 0


async def test_start_resets_the_state_of_a_sequence_that_did_not_end(accumulator: Path) -> None:
    harness = Harness(accumulator)
    await _outputs(harness.step(3, 7, start=True))
    assert (await _outputs(harness.step(3, 1, start=True)))[0] == 1


async def test_a_sequence_unknown_ended_or_expired_needs_start(accumulator: Path) -> None:
    harness = Harness(accumulator)
    message = "inference request for sequence 9 to model 'acc' must specify the START flag"
    with pytest.raises(InvalidArgument, match=message):
        harness.step(9, 1)
    await _outputs(harness.step(9, 1, start=True, end=True))
    with pytest.raises(InvalidArgument, match=message):
        harness.step(9, 1)  # ended
    await _outputs(harness.step(9, 1, start=True))
    await asyncio.sleep(0.15)  # idle past max_sequence_idle_microseconds (50 ms)
    assert harness.batcher.live == 0
    assert harness.batcher.stats.sequences_expired == 1
    with pytest.raises(InvalidArgument, match=message):
        harness.step(9, 1)


async def test_requests_without_a_sequence_or_of_several_rows_are_refused(
    accumulator: Path,
) -> None:
    harness = Harness(accumulator)
    item = harness.step(1, 1, start=True)
    await _outputs(item)
    lone = WorkItem({"INPUT": np.zeros((1, 1), np.int32)}, 1, ("OUTPUT",), 1, 0, None,
                    asyncio.get_running_loop().create_future())  # fmt: skip
    with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty correlation"):
        harness.batcher.submit(lone)
    rows = WorkItem({"INPUT": np.zeros((2, 1), np.int32)}, 2, ("OUTPUT",), 1, 0, None,
                    asyncio.get_running_loop().create_future(),
                    sequence=SequenceFlags(5, start=True))  # fmt: skip
    with pytest.raises(InvalidArgument, match="must specify batch-size 1"):
        harness.batcher.submit(rows)


async def test_a_held_step_whose_client_left_cancels_its_sequence(accumulator: Path) -> None:
    """Triton's rule (its L0_request_cancellation): cancelling a request held in a sequence
    cancels the whole sequence. The other held step is answered CANCELLED at once, the
    running step finishes, and the sequence has ended: only a new START may follow."""
    harness = Harness(accumulator)
    first = harness.step(4, 10, start=True)
    gone = harness.step(4, 1000)  # held behind the first
    other = harness.step(4, 100)
    gone.future.cancel()
    with pytest.raises(Cancelled, match="another request of its sequence was cancelled"):
        await other.future
    assert (await _outputs(first))[0] == 10
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        harness.step(4, 1)
    assert (await _outputs(harness.step(4, 1, start=True)))[0] == 1


async def test_a_backlogged_sequence_whose_step_is_cancelled_leaves_the_backlog(
    accumulator: Path,
) -> None:
    harness = Harness(accumulator)
    harness.batcher.max_candidates = 1
    harness.batcher.sequences = replace(harness.batcher.sequences, idle_ns=10**10)
    await _outputs(harness.step(1, 1, start=True))
    waiting = harness.step(2, 2, start=True)
    later = harness.step(2, 3)
    assert harness.batcher.backlog == 1
    assert harness.batcher.pending_requests() == 2
    waiting.future.cancel()
    with pytest.raises(Cancelled):
        await later.future
    assert harness.batcher.backlog == 0
    assert harness.batcher.live == 1
    assert harness.batcher.pending_requests() == 0


async def test_a_start_past_the_live_cap_is_refused_until_one_ends(accumulator: Path) -> None:
    harness = Harness(accumulator)
    harness.batcher.max_live = 2
    await _outputs(harness.step(1, 1, start=True))
    await _outputs(harness.step(2, 1, start=True))
    with pytest.raises(Overloaded, match="model 'acc' holds 2 live sequences"):
        harness.step(3, 1, start=True)
    assert (await _outputs(harness.step(1, 5, start=True)))[0] == 5  # a restart is no new one
    await _outputs(harness.step(2, 1, end=True))
    assert (await _outputs(harness.step(3, 1, start=True)))[0] == 1


async def test_sequences_past_the_candidate_slots_wait_in_the_backlog_until_one_ends(
    accumulator: Path,
) -> None:
    harness = Harness(accumulator)
    assert harness.batcher.max_candidates == 8  # direct: one per slot of the one instance
    harness.batcher.max_candidates = 2
    harness.batcher.sequences = replace(harness.batcher.sequences, idle_ns=10**10)
    await _outputs(harness.step(1, 1, start=True))
    await _outputs(harness.step(2, 2, start=True))
    waiting = harness.step(3, 3, start=True)
    later = harness.step(3, 4)
    await asyncio.sleep(0.05)
    assert not waiting.future.done()
    assert harness.batcher.backlog == 1
    assert harness.batcher.live == 3
    assert (await _outputs(harness.step(2, 5)))[0] == 7  # candidates keep running
    await _outputs(harness.step(1, 1, end=True))
    assert await _outputs(waiting) == (3, 3, 0)
    assert (await _outputs(later))[0] == 7
    assert harness.batcher.backlog == 0


async def test_an_expired_candidate_frees_its_slot_for_the_backlog(accumulator: Path) -> None:
    harness = Harness(accumulator)
    harness.batcher.max_candidates = 1
    await _outputs(harness.step(1, 1, start=True))
    waiting = harness.step(2, 6, start=True)
    assert (await _outputs(waiting))[0] == 6  # sequence 1 idled past 50 ms and expired
    assert harness.batcher.stats.sequences_expired == 1


async def test_a_backlogged_sequence_past_a_request_s_timeout_is_dropped(
    accumulator: Path,
) -> None:
    """Triton's reaper (L0_sequence_batcher's request-timeout tests): every request of a
    sequence still waiting for a slot when the earliest timeout passes is refused, and the
    sequence is gone, so its later steps need START. They used to wait past their timeout
    for a slot, and the sequence lived on."""
    harness = Harness(accumulator)
    harness.batcher.max_candidates = 1
    harness.batcher.sequences = replace(harness.batcher.sequences, idle_ns=10**10)
    await _outputs(harness.step(1, 1, start=True))  # holds the only slot
    waiting = [harness.step(2, 2, start=True, timeout_s=0.05), harness.step(2, 3, timeout_s=30)]
    for item in waiting:
        with pytest.raises(Unavailable) as refused:
            await asyncio.wait_for(item.future, 5)
        assert refused.value.message.startswith(
            "timeout of the corresponding sequence has been expired"
        )
    assert (harness.batcher.backlog, harness.batcher.live) == (0, 1)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        harness.step(2, 4, end=True)
    promoted = harness.step(3, 5, start=True, timeout_s=5)  # a slot frees before it expires
    await _outputs(harness.step(1, 1, end=True))
    assert (await _outputs(promoted))[0] == 5
    await asyncio.sleep(0.1)
    assert harness.batcher.live == 1


async def test_unloading_answers_the_backlog(accumulator: Path) -> None:
    harness = Harness(accumulator)
    harness.batcher.max_candidates = 1
    await _outputs(harness.step(1, 1, start=True))
    waiting = harness.step(2, 6, start=True)
    await harness.batcher.close()
    with pytest.raises(Unavailable, match="model was unloaded"):
        await _outputs(waiting)


GROWING = """
name: "history" max_batch_size: 8
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [-1] }]
output [{ name: "TOTAL" data_type: TYPE_INT32 dims: [1] },
        { name: "LENGTH" data_type: TYPE_INT32 dims: [1] }]
sequence_batching {
  state [{ input_name: "HISTORY_IN" output_name: "HISTORY_OUT" data_type: TYPE_INT32
           dims: [-1] }]
}
"""


def _history_model(path: Path) -> Path:
    """HISTORY_OUT = HISTORY_IN followed by INPUT (a state that grows); TOTAL its sum;
    LENGTH its length."""
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis")
    nodes = [
        helper.make_node("Concat", ["HISTORY_IN", "INPUT"], ["HISTORY_OUT"], axis=1),
        helper.make_node("ReduceSum", ["HISTORY_OUT", "axis"], ["TOTAL"], keepdims=1),
        helper.make_node("Mul", ["HISTORY_OUT", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("ReduceSum", ["ones", "axis"], ["LENGTH"], keepdims=1),
    ]
    constants = [
        axis,
        numpy_helper.from_array(np.array(0, np.int32), "zero"),
        numpy_helper.from_array(np.array(1, np.int32), "one"),
    ]
    int32 = TensorProto.INT32
    graph = helper.make_graph(
        nodes,
        "history",
        [helper.make_tensor_value_info(n, int32, ["batch", n + "_length"])
         for n in ("INPUT", "HISTORY_IN")],
        [helper.make_tensor_value_info("HISTORY_OUT", int32, ["batch", "out_length"]),
         *(helper.make_tensor_value_info(n, int32, ["batch", 1]) for n in ("TOTAL", "LENGTH"))],
        constants,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


async def test_a_state_of_variable_size_starts_at_one_element_and_grows(tmp_path: Path) -> None:
    """Triton's rule for a state with variable dims (L0_sequence_batcher's variable implicit
    models): 1 at START, then whatever the model outputs. Such a model used to fail to
    load with numpy's 'negative dimensions are not allowed'."""
    config = parse_pbtxt(GROWING)
    backend = OnnxBackend()
    backend.load(_history_model(tmp_path / "history.onnx"), config, CPU)
    sequences = SequencePolicy.from_config(config)
    assert sequences is not None
    assert sequences.states[0].initial.shape == (1,)
    batcher = SequenceBatcher(
        "history",
        InstancePool([Instance("history-0", backend)]),
        BatchPolicy.from_config(config, server_max_queue_size=64),
        ModelStats(),
        sequences,
    )

    def step(sequence_id: int, values: list[int], start: bool = False) -> WorkItem:
        item = WorkItem(
            inputs={"INPUT": np.array([values], np.int32)},
            batch_size=1,
            output_names=("TOTAL", "LENGTH"),
            priority=1,
            enqueued_ns=0,
            deadline_ns=None,
            future=asyncio.get_running_loop().create_future(),
            sequence=SequenceFlags(sequence_id, start, False),
        )
        batcher.submit(item)
        return item

    async def answer(item: WorkItem) -> tuple[int, int]:
        out = await asyncio.wait_for(item.future, 5)
        return int(out["TOTAL"][0, 0]), int(out["LENGTH"][0, 0])

    steps = [step(1, [1, 2], start=True), step(2, [10], start=True), step(1, [3, 4, 5]),
             step(2, [20, 30]), step(1, [6])]  # fmt: skip
    assert [await answer(item) for item in steps] == [(3, 3), (10, 2), (15, 6), (60, 4), (21, 7)]
    await batcher.close()


async def test_the_scheduler_delay_counts_steps_held_in_slots_then_the_backlog(
    accumulator: Path,
) -> None:
    """``--delay-scheduler 4 --backlog-delay-scheduler 2``, as Triton's sequence batcher
    counts them: four requests of sequences with a slot (queued, or held behind their
    sequence's previous step), then two waiting in the backlog, before the first batch."""
    harness = Harness(accumulator, hold=(4, 2))
    harness.batcher.max_candidates = 2
    slotted = [harness.step(1, 1, start=True), harness.step(2, 10, start=True)]
    slotted += [harness.step(1, 2, end=True), harness.step(2, 20, end=True)]
    backlogged = [harness.step(3, 100, start=True)]
    await asyncio.sleep(0.05)
    assert not any(item.future.done() for item in slotted + backlogged)
    assert harness.batcher.pending_requests() == 5
    backlogged.append(harness.step(3, 200, end=True))
    results = [await _outputs(item) for item in slotted + backlogged]
    assert results == [(1, 1, 0), (10, 2, 0), (3, 1, 1), (30, 2, 1), (100, 3, 0), (300, 3, 1)]
    batches = harness.batcher.stats.batches  # the slotted two together, then the third alone
    assert {size: one.compute_infer.count for size, one in batches.items()} == {2: 2, 1: 2}


async def test_a_sequence_restarted_while_ending_keeps_its_held_steps_counted(
    accumulator: Path,
) -> None:
    """A START for an id whose sequence has its END queued starts a new sequence; the old
    one's steps still held count as pending (Triton's ``nv_inference_pending_request_count``)
    and are answered."""
    harness = Harness(accumulator)
    old = [harness.step(5, 1, start=True), harness.step(5, 2), harness.step(5, 3, end=True)]
    new = harness.step(5, 7, start=True)
    assert harness.batcher.pending_requests() == 4
    assert [(await _outputs(item))[0] for item in old] == [1, 3, 6]
    assert (await _outputs(new))[0] == 7
    assert harness.batcher.pending_requests() == 0
