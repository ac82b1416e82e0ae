"""A decoupled ensemble: one whose steps include a decoupled model, answering any number of
times, as Triton runs it.

Triton gives each response of a decoupled step its own copy of the tensors it writes, and
runs the steps that read them once per response; the ensemble answers each time its
outputs are all written, and ends with a final flag once every step is done. Its load
check (``ensemble_config.decoupled_labels``) makes sure no step reads tensors of two
decoupled origins, so the steps after a decoupled one read only what one of its responses
wrote (and what was written from that): each response starts a flow of those steps on a
copy of the tensors, independent of the others. The ensemble's outputs all come from one
origin, so each flow that writes them answers once, when its steps are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from asyncio import Task
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Coroutine

from batchserve.core.types import Tensor
from batchserve.core.validation import ValidRequest, validate_request
from batchserve.models import admission
from batchserve.models.ensemble import (
    EnsembleBatcher,
    StepDone,
    Value,
    Values,
    in_ensemble,
    step_outputs,
    step_request,
    step_timeout_us,
)
from batchserve.models.ensemble_config import EnsembleStep
from batchserve.models.model_table import ServedVersion
from batchserve.models.replies import counted
from batchserve.observability import trace_records
from batchserve.observability.trace_records import StepTrace
from batchserve.scheduler.responders import CountedRequests, Reply
from batchserve.scheduler.work import Arrays, WorkItem

Emit = Callable[[Values], None]
"""Takes a flow's tensors once its steps are done."""


class EnsembleResponder(CountedRequests):
    """Answers a decoupled ensemble's requests through its ``EnsembleBatcher``'s steps,
    the decoupled ones (``decoupled``) streamed, one flow of what follows per response."""

    def __init__(self, batcher: EnsembleBatcher, decoupled: Collection[EnsembleStep]) -> None:
        super().__init__()
        self._batcher = batcher
        self._decoupled = frozenset(decoupled)

    def replies(
        self, inputs: Arrays, cancelled: Callable[[], bool] | None, streaming: bool = True
    ) -> AsyncGenerator[Reply, None]:
        """A request with no priority, timeout or sequence of its own, asking for every
        output (the dataplane uses ``replies_to``, which carries them)."""
        rows = next(iter(inputs.values())).shape[0] if inputs else 1
        item = WorkItem(inputs, rows, self._batcher.output_names, 0, time.monotonic_ns(), None,
                        asyncio.get_running_loop().create_future(), cancelled)  # fmt: skip
        return self.replies_to(item, streaming)

    async def replies_to(
        self, item: WorkItem, streaming: bool, traced: StepTrace | None = None
    ) -> AsyncGenerator[Reply, None]:
        """Each set of outputs as a flow writes them, then the final flag. ``traced``: this
        ensemble is a traced request's step, and its steps are traced under it."""
        answers: asyncio.Queue[Values | None] = asyncio.Queue()
        steps = list(self._batcher.steps_for(item))

        async def run() -> None:
            try:
                await self._flow(item, steps, self._batcher.start_values(item), answers.put_nowait)
            finally:
                answers.put_nowait(None)  # (after a failure too: the loop below ends)

        self._began()
        flow = _started_under(run(), traced)
        try:
            while (values := await answers.get()) is not None:
                yield Reply(self._batcher.outputs_of(values, item.output_names))
            try:
                await flow  # a step's failure ends the request with it
            except Exception as exc:
                raise in_ensemble(self._batcher.name, exc) from exc
            yield Reply(final=True)
        finally:
            if not flow.done():
                flow.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await flow
            self._ended()

    async def _flow(
        self, item: WorkItem, steps: list[EnsembleStep], values: Values, emit: Emit
    ) -> None:
        """Run ``steps`` on ``values`` as their inputs are written; a decoupled step's each
        response starts a flow of the steps after it. Once done, hand on the tensors if they
        hold every output asked for (a flow before the decoupled step that writes them
        does not)."""
        running: set[asyncio.Future[StepDone | None]] = set()
        run_step = self._batcher.run_step
        try:
            while steps or running:
                for step in [s for s in steps if all(t in values for t in s.needs)]:
                    steps.remove(step)
                    if step in self._decoupled:
                        after = _after(step, steps)
                        steps[:] = [s for s in steps if s not in after]
                        running.add(asyncio.ensure_future(
                            self._fan_out(step, item, values, after, emit)
                        ))  # fmt: skip
                    else:
                        running.add(asyncio.ensure_future(_step(run_step, step, item, values)))
                if not running:
                    break  # the rest read tensors nothing writes: answered as a deadlock
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if (finished := task.result()) is not None:
                        values.update(finished.outputs)
        finally:
            for task in running:
                task.cancel()
        if all(values.get(name) is not None for name in item.output_names):
            emit(values)

    async def _fan_out(
        self,
        step: EnsembleStep,
        item: WorkItem,
        values: Values,
        after: list[EnsembleStep],
        emit: Emit,
    ) -> StepDone | None:
        """Run the decoupled ``step``; each response starts a flow of ``after`` on a copy of
        the tensors with what it wrote. Done when the step and every flow are."""
        flows: set[asyncio.Future[None]] = set()
        limit = self._batcher.inflight_limit(step)
        try:
            async with limit if limit is not None else contextlib.nullcontext():
                async for written in self._responses(step, item, values):
                    fork = dict(values)
                    fork.update(written)
                    flows.add(asyncio.ensure_future(self._flow(item, list(after), fork, emit)))
            for finished in asyncio.as_completed(flows):
                await finished
        finally:
            for flow in flows:
                flow.cancel()
        return None  # what it wrote went to its flows

    async def _responses(
        self, step: EnsembleStep, item: WorkItem, values: Values
    ) -> AsyncGenerator[dict[str, Value], None]:
        """The tensors each response of the decoupled ``step`` writes, its model's
        statistics counting the request as a client's; traced, where the request is, as one
        trace with every response's outputs, as Triton traces a decoupled step."""
        served = self._batcher.composing(step)
        tensors, wanted = step_request(step, served, values)
        traced = trace_records.step_of(served.name, str(served.version))
        started = time.monotonic_ns()
        served.stats.received += 1
        written: list[Tensor] = []
        try:
            try:
                valid = validate_request(tensors, wanted, served.schema)
                replies = _step_replies(served, valid, item, started, traced)
            except BaseException as exc:
                admission.record_failure(served, started, exc, "", "")
                raise
            batch = valid.batch_size if served.config.max_batch_size > 0 else 0
            types = served.output_types
            stream = counted(served, replies, started, "", "", empty_final=False)
            async with contextlib.aclosing(stream):
                async for reply in stream:
                    arrays = {name: reply.outputs[name] for name, _ in step.outputs
                              if name in reply.outputs}  # fmt: skip
                    if traced is not None and traced.tensors:
                        written += step_outputs(served, arrays)
                    yield {
                        tensor: Value(types[model_output], arrays[model_output], batch)
                        for model_output, tensor in step.outputs
                        if model_output in arrays
                    }
        finally:
            if traced is not None:
                traced.done(tensors, written)


async def _step(
    run_step: Callable[[EnsembleStep, WorkItem, Values], Awaitable[StepDone]],
    step: EnsembleStep,
    item: WorkItem,
    values: Values,
) -> StepDone | None:
    return await run_step(step, item, values)


def _step_replies(
    served: ServedVersion, valid: ValidRequest, item: WorkItem, started: int,
    traced: StepTrace | None,
) -> AsyncGenerator[Reply, None]:  # fmt: skip
    """A decoupled step's replies: a nested decoupled ensemble's carry the request's
    priority, timeout and sequence on to its own steps, traced under ``traced``."""
    responder = served.responder
    assert responder is not None, "a decoupled step's model has a responder"
    if isinstance(responder, EnsembleResponder):
        nested = admission.work_item(served, valid, item.priority, step_timeout_us(item),
                                     started, item.is_cancelled)  # fmt: skip
        nested.sequence = item.sequence
        return responder.replies_to(nested, True, traced)
    return responder.replies(valid.inputs, item.is_cancelled, True)


def _started_under(flow: Coroutine[object, object, None], traced: StepTrace | None) -> Task[None]:
    """``flow`` as a task, with ``traced`` (a composite step's trace) current in it, so that
    the steps it runs are traced under that step."""
    if traced is None:
        return asyncio.ensure_future(flow)
    traced.composite = True
    token = trace_records.enter_step(traced)
    try:
        return asyncio.ensure_future(flow)  # (the task takes the context as it is now)
    finally:
        trace_records.leave_step(token)


def _after(step: EnsembleStep, steps: list[EnsembleStep]) -> list[EnsembleStep]:
    """The steps of ``steps`` that read, directly or not, what ``step`` writes."""
    written = {tensor for _, tensor in step.outputs}
    after: list[EnsembleStep] = []
    grew = True
    while grew:
        grew = False
        for other in steps:
            if other not in after and other.needs & written:
                after.append(other)
                written.update(tensor for _, tensor in other.outputs)
                grew = True
    return [s for s in steps if s in after]
