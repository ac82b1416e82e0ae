"""Text generation with step-level batching: one step of a stateful step model per
iteration, for every active generation at once.

Batching whole generations would hold each batch for its longest member and stream
nothing. Here a generation is a prompt fed one token a step, then one sampled token a
step; after each step every generation that produced a character answers it at once
(a reply of the decoupled model), and generations join and leave between steps. Each
step goes to the step model's sequence batcher as one urgent batch of rows whose state
this loop holds (``SequenceBatcher.submit_held``), so it shares the step model's
instances, memory budget and statistics with the step model's own clients. A generation
whose client went away is dropped before the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

import numpy as np

from batchserve.core.errors import InvalidArgument, Overloaded, Unavailable
from batchserve.core.types import SequenceFlags
from batchserve.scheduler.responders import Reply
from batchserve.scheduler.sequences import SequenceBatcher, State
from batchserve.scheduler.work import Arrays, WorkItem

logger = logging.getLogger(__name__)

PROMPT, MAX_TOKENS, TEMPERATURE, SEED = "text_input", "max_tokens", "temperature", "random_seed"
STREAM = "stream"
TEXT = "text_output"
"""Tensor names of a generation model (those of Triton's LLM examples)."""
REPLACEMENT = "\ufffd"


class Vocabulary:
    """The step model's tokens: ``symbols[i]`` is what token ``i`` stands for. An empty
    symbol (padding) is never generated; a character without a token becomes the token of
    U+FFFD where there is one, else is refused."""

    def __init__(self, symbols: tuple[str, ...]) -> None:
        self.symbols = symbols
        self.generable = np.array([bool(s) for s in symbols])
        """Which tokens sampling may pick."""
        self._ids = {s: i for i, s in reversed(list(enumerate(symbols)))}
        self._unknown = self._ids.get(REPLACEMENT)
        self._encoded = [s.encode() for s in symbols]

    def encode(self, text: str) -> list[int]:
        tokens = []
        for character in text:
            token = self._ids.get(character, self._unknown)
            if token is None:
                raise InvalidArgument(
                    f"input '{PROMPT}': character {character!r} is not in the model's vocabulary"
                )
            tokens.append(token)
        return tokens

    def encoded(self, token: int) -> bytes:
        return self._encoded[token]


@dataclass(frozen=True, slots=True)
class GenerationLimits:
    default_tokens: int = 64
    max_tokens: int = 1024
    max_prompt: int = 4096


@dataclass(frozen=True, slots=True)
class StepModel:
    """How the loop reaches its step model: ``batcher`` returns the loaded one's sequence
    batcher (raising when it is not served); the names are its token input and logits
    output."""

    name: str
    batcher: Callable[[], SequenceBatcher]
    token_input: str
    logits_output: str


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator,
           allowed: np.ndarray) -> int:  # fmt: skip
    """A token from the softmax of ``logits / temperature``; the most likely at 0."""
    scores = np.where(allowed, logits.astype(np.float64), -np.inf)
    if temperature <= 0:
        return int(np.argmax(scores))
    scores = (scores - scores.max()) / temperature
    weights = np.cumsum(np.exp(scores))
    return int(np.searchsorted(weights, rng.random() * weights[-1], side="right"))


@dataclass(eq=False)
class _Generation:
    id: int
    prompt: deque[int]
    left: int
    temperature: float
    rng: np.random.Generator
    replies: asyncio.Queue[Reply | BaseException]
    cancelled: Callable[[], bool] | None
    token: int = 0
    state: Arrays | None = None
    gone: bool = False

    def stopped(self) -> bool:
        return self.gone or (self.cancelled is not None and self.cancelled())


@dataclass(eq=False)
class GenerationLoop:
    """The decoupled responder of a generation model (``responders.Responder``)."""

    model: str
    step: StepModel
    vocabulary: Vocabulary
    limits: GenerationLimits = field(default_factory=GenerationLimits)
    steps: int = 0
    """Steps run (iterations x chunks), for the statistics and the tests."""
    rows: int = 0
    """Rows run over all steps: ``rows / steps`` is the mean step batch."""
    _joining: list[_Generation] = field(default_factory=list)
    _active: list[_Generation] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _closed: bool = False

    @property
    def active(self) -> int:
        return len(self._active) + len(self._joining)

    async def replies(
        self, inputs: Arrays, cancelled: Callable[[], bool] | None, streaming: bool = True
    ) -> AsyncGenerator[Reply, None]:
        """One reply per character when streaming (input ``stream``, else ``streaming``),
        else one with the whole text."""
        each = bool(_scalar(inputs, STREAM, streaming))
        generation = self._join(inputs, cancelled)
        text: list[bytes] = []
        try:
            while True:
                reply = await generation.replies.get()
                if isinstance(reply, BaseException):
                    raise reply
                if each:
                    yield reply
                else:
                    text.append(reply.outputs[TEXT][0])
                if reply.final:
                    break
        finally:
            generation.gone = True
        if not each:
            yield Reply({TEXT: np.array([b"".join(text)], dtype=np.object_)}, final=True)

    def _join(self, inputs: Arrays, cancelled: Callable[[], bool] | None) -> _Generation:
        if self._closed:
            raise Unavailable("model is being unloaded")
        prompt = self._prompt(inputs)
        tokens = _scalar(inputs, MAX_TOKENS, self.limits.default_tokens)
        if not 1 <= tokens <= self.limits.max_tokens:
            raise InvalidArgument(
                f"input '{MAX_TOKENS}': {tokens} is outside 1..{self.limits.max_tokens}"
            )
        temperature = float(_scalar(inputs, TEMPERATURE, 1.0))
        if not (np.isfinite(temperature) and temperature >= 0):
            raise InvalidArgument(f"input '{TEMPERATURE}': {temperature} is not a number >= 0")
        batcher = self.step.batcher()
        if self.active + batcher.live >= batcher.max_live:
            raise Overloaded(
                f"model '{self.model}' runs {self.active} generations, the most the state "
                f"budget of '{self.step.name}' allows beside its {batcher.live} live sequences"
            )
        generation = _Generation(
            id=next(self._ids),
            prompt=deque(prompt),
            left=int(tokens),
            temperature=temperature,
            rng=np.random.default_rng(int(_scalar(inputs, SEED, 0))),
            replies=asyncio.Queue(),
            cancelled=cancelled,
        )
        self._joining.append(generation)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return generation

    def _prompt(self, inputs: Arrays) -> list[int]:
        raw = inputs[PROMPT].reshape(-1)
        if raw.size != 1:
            raise InvalidArgument(f"input '{PROMPT}': expected one string, got {raw.size}")
        try:
            text = bytes(raw[0]).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"input '{PROMPT}': the prompt is not valid UTF-8") from None
        if not text:
            raise InvalidArgument(f"input '{PROMPT}': the prompt is empty (send at least one "
                                  "character to continue from)")  # fmt: skip
        if len(text) > self.limits.max_prompt:
            raise InvalidArgument(
                f"input '{PROMPT}': {len(text)} characters is over the {self.limits.max_prompt}"
                "-character limit"
            )
        return self.vocabulary.encode(text)

    # the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                self._active += self._joining
                self._joining.clear()
                self._active = [g for g in self._active if not g.stopped()]
                if not self._active:
                    return
                await self._iterate()
        except BaseException as exc:  # no generation is left waiting, whatever happened
            for generation in self._active + self._joining:
                generation.replies.put_nowait(exc)
            self._active.clear()
            self._joining.clear()
            if not isinstance(exc, Exception):
                raise
            logger.exception("generation loop failed", extra={"model": self.model})
        finally:
            self._task = None
            if self._joining:  # joined while the loop was ending
                self._task = asyncio.get_running_loop().create_task(self._run())

    async def _iterate(self) -> None:
        """One step for every active generation, in chunks of the step model's batch cap."""
        try:
            batcher = self.step.batcher()
        except Exception as exc:
            self._fail(self._active, exc)
            return
        cap = batcher.cap
        chunks = [self._active[i : i + cap] for i in range(0, len(self._active), cap)]
        outcomes = await asyncio.gather(
            *(self._run_chunk(batcher, chunk) for chunk in chunks), return_exceptions=True
        )
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._fail(chunk, outcome)
            else:
                self._advance(chunk, outcome, batcher.sequences.states)

    async def _run_chunk(self, batcher: SequenceBatcher, chunk: list[_Generation]) -> Arrays:
        policy = batcher.sequences
        rows = []
        for generation in chunk:
            if generation.prompt:
                generation.token = generation.prompt.popleft()
            flags = SequenceFlags(generation.id, start=generation.state is None)
            rows.append(policy.rows(flags, generation.state))
        inputs = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
        tokens = np.array([[g.token] for g in chunk], dtype=np.int64)
        inputs[self.step.token_input] = tokens
        item = WorkItem(
            inputs=inputs,
            batch_size=len(chunk),
            output_names=(self.step.logits_output, *policy.output_names),
            priority=batcher.policy.default_priority,
            enqueued_ns=time.monotonic_ns(),
            deadline_ns=None,
            future=asyncio.get_running_loop().create_future(),
            clients=len(chunk),
            urgent=True,
        )
        batcher.submit_held(item)
        outputs = await item.future
        self.steps += 1
        self.rows += len(chunk)
        return outputs

    def _advance(
        self, chunk: list[_Generation], outputs: Arrays, states: tuple[State, ...]
    ) -> None:
        logits = outputs[self.step.logits_output]
        allowed = self.vocabulary.generable
        for row, generation in enumerate(chunk):
            generation.state = {s.input: outputs[s.output][row] for s in states}
            if generation.prompt or generation.stopped():
                continue
            token = sample(logits[row], generation.temperature, generation.rng, allowed)
            generation.token = token
            generation.left -= 1
            text = np.array([self.vocabulary.encoded(token)], dtype=np.object_)
            generation.replies.put_nowait(Reply({TEXT: text}, final=generation.left == 0))
            if generation.left == 0:
                generation.gone = True

    def _fail(self, chunk: list[_Generation], error: BaseException) -> None:
        for generation in chunk:
            generation.replies.put_nowait(error)
            generation.gone = True

    async def close(self) -> None:
        """Refuse new generations; those running finish."""
        self._closed = True
        while self._task is not None:
            await asyncio.shield(self._task)


def _scalar(inputs: Arrays, name: str, default: float) -> float:
    array = inputs.get(name)
    if array is None:
        return default
    if array.size != 1:
        raise InvalidArgument(f"input '{name}': expected one value, got {array.size}")
    return array.reshape(-1)[0].item()  # type: ignore[no-any-return]
