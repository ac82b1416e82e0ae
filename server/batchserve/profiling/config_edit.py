"""A setting written into a config.pbtxt: three fields change, everything else stays.

``apply`` changes the ``ModelConfig`` message. ``rewrite`` edits the file's text in place of
those fields only, so comments, order and layout survive; the result is parsed and compared
with ``apply``'s message, and where the edit could not be made or does not match (a layout the
small reader below does not follow), the message is rendered afresh instead: the same config,
without the comments (protobuf's text format keeps none).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from batchserve.core.errors import ModelConfigError
from batchserve.models.model_config import parse_pbtxt, to_pbtxt
from batchserve.profiling.plan import Setting
from batchserve.proto.model_config_pb2 import ModelConfig

BACKUP_SUFFIX = ".orig"


def current_setting(config: ModelConfig) -> Setting:
    """What a completed config says now (a group's unset count means one instance; a
    sequence-batched model has no queue delay of the dynamic batcher's)."""
    instances = max((group.count or 1 for group in config.instance_group), default=1)
    delay = None
    if not config.HasField("sequence_batching"):
        delay = config.dynamic_batching.max_queue_delay_microseconds
    return Setting(instances, config.max_batch_size, delay)


def apply(config: ModelConfig, setting: Setting) -> ModelConfig:
    """A copy of ``config`` with the setting's instance count, batch size and queue delay.

    Every instance group gets the count; a config without one gets a group only where the
    count is not the default single instance. A model that does not batch keeps its
    scheduling as it is, and so does a sequence-batched one (no queue delay to set).
    """
    done = ModelConfig()
    done.CopyFrom(config)
    for group in done.instance_group:
        if (group.count or 1) != setting.instances:
            group.count = setting.instances
    if not done.instance_group and setting.instances != 1:
        done.instance_group.add(count=setting.instances)
    if setting.max_batch_size > 0:
        done.max_batch_size = setting.max_batch_size
    if setting.max_batch_size > 0 and setting.queue_delay_us is not None:
        done.dynamic_batching.SetInParent()
        done.dynamic_batching.max_queue_delay_microseconds = setting.queue_delay_us
    return done


def rewrite(text: str, setting: Setting) -> tuple[str, bool]:
    """The file's text with ``setting`` applied, and whether its layout (comments) was kept."""
    old = parse_pbtxt(text)
    new = apply(old, setting)
    try:
        edited = _edit(text, old, new)
        if parse_pbtxt(edited) == new:
            return edited, True
    except (_Unreadable, ModelConfigError):
        pass
    return to_pbtxt(new), False


def write(path: Path, text: str) -> Path | None:
    """Replace ``path`` with ``text`` atomically, first copying the file there to the first
    free ``config.pbtxt.orig``, ``.orig.1``, ...; returns that copy (None: nothing was there)."""
    backup = None
    if path.exists():
        backup = _free_backup_name(path)
        shutil.copy2(path, backup)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        if backup is not None:
            shutil.copymode(backup, temporary)
        else:
            os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return backup


def _free_backup_name(path: Path) -> Path:
    candidate = path.with_name(path.name + BACKUP_SUFFIX)
    number = 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}{BACKUP_SUFFIX}.{number}")
    return candidate


# --- the text edit -----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<space>\s+)|(?P<comment>\#[^\n]*)
    |(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<punct>[{}\[\]<>:,;])|(?P<word>[^\s{}\[\]<>:,;"'\#]+)""",
    re.VERBOSE,
)
_CLOSERS = {"{": "}", "<": ">"}


class _Unreadable(Exception):
    """The text uses syntax the reader below does not follow; the caller re-renders."""


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


@dataclass
class _Block:
    """A message in the text: where its body lies, its scalar values and its sub-messages."""

    body_start: int
    body_end: int = 0
    scalars: dict[str, list[_Token]] = field(default_factory=lambda: defaultdict(list))
    blocks: dict[str, list[_Block]] = field(default_factory=lambda: defaultdict(list))


class _Reader:
    """Just enough of protobuf's text format to find where each field's value is written."""

    def __init__(self, text: str) -> None:
        self.tokens = [t for t in _tokens(text) if t.kind not in ("space", "comment")]
        self.end = len(text)
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at].text if self.at < len(self.tokens) else None

    def block(self, body_start: int, closer: str | None) -> _Block:
        block = _Block(body_start)
        while self.peek() != closer:
            name = self._take("word")
            if self.peek() == ":":
                self.at += 1
            self._value(block, name.text)
            if self.peek() in (",", ";"):
                self.at += 1
        if closer is None:
            block.body_end = self.end
        else:
            block.body_end = self._take("punct").start
        return block

    def _value(self, block: _Block, name: str) -> None:
        token = self._take()
        if token.text in _CLOSERS:
            block.blocks[name].append(self.block(token.end, _CLOSERS[token.text]))
        elif token.text == "[":
            while self.peek() != "]":
                self._value(block, name)
                if self.peek() == ",":
                    self.at += 1
            self.at += 1
        elif token.kind in ("word", "string"):
            block.scalars[name].append(token)
            while token.kind == "string" and self.at < len(self.tokens):
                if self.tokens[self.at].kind != "string":
                    break
                self.at += 1  # adjacent strings are one value
        else:
            raise _Unreadable(f"unexpected {token.text!r}")

    def _take(self, kind: str | None = None) -> _Token:
        if self.at >= len(self.tokens):
            raise _Unreadable("the text ends inside a message")
        token = self.tokens[self.at]
        if kind is not None and token.kind != kind:
            raise _Unreadable(f"unexpected {token.text!r}")
        self.at += 1
        return token


def _tokens(text: str) -> list[_Token]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.lastgroup is None:
            raise _Unreadable(f"cannot read the text at offset {position}")
        tokens.append(_Token(match.lastgroup, match.group(), position, match.end()))
        position = match.end()
    return tokens


@dataclass
class _Edits:
    """Replacements and insertions at offsets of the original text, applied last to first."""

    text: str
    changes: list[tuple[int, int, str]] = field(default_factory=list)

    def set_scalar(self, block: _Block, name: str, value: int) -> None:
        """Rewrite the field's value where it is written, else add it at the block's end."""
        written = block.scalars.get(name)
        if written:
            self.changes.append((written[-1].start, written[-1].end, str(value)))
        else:
            self.insert(block, f"{name}: {value}")

    def insert(self, block: _Block, line: str) -> None:
        """``line`` as the block's last field: at the end of the file, on a line of its own
        above a closing brace that has its own line (indented two more spaces than it), or
        else just before the closing brace."""
        end = block.body_end
        if end == len(self.text):
            self.changes.append((end, end, f"{line}\n"))
            return
        line_start = self.text.rfind("\n", block.body_start, end) + 1
        indent = self.text[line_start:end]
        if line_start > 0 and not indent.strip():
            self.changes.append((line_start, line_start, f"{indent}  {line}\n"))
            return
        filled = len(self.text[:end].rstrip())
        self.changes.append((filled, end, f" {line} "))

    def result(self) -> str:
        text = self.text
        for start, end, new in sorted(self.changes, reverse=True):
            text = text[:start] + new + text[end:]
        return text


def _edit(text: str, old: ModelConfig, new: ModelConfig) -> str:
    """``text`` with the swept fields of ``new`` written where ``old`` differs."""
    if not text.endswith("\n") and text:
        text += "\n"
    top = _Reader(text).block(0, None)
    edits = _Edits(text)
    if new.max_batch_size != old.max_batch_size:
        edits.set_scalar(top, "max_batch_size", new.max_batch_size)
    _edit_instances(edits, top, old, new)
    if new.dynamic_batching != old.dynamic_batching or new.HasField("dynamic_batching") != (
        old.HasField("dynamic_batching")
    ):
        delay = new.dynamic_batching.max_queue_delay_microseconds
        batching = top.blocks.get("dynamic_batching")
        if batching:
            edits.set_scalar(batching[-1], "max_queue_delay_microseconds", delay)
        else:
            edits.insert(top, f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}")
    return edits.result()


def _edit_instances(edits: _Edits, top: _Block, old: ModelConfig, new: ModelConfig) -> None:
    if list(new.instance_group) == list(old.instance_group):
        return
    groups = top.blocks.get("instance_group", [])
    if len(groups) != len(old.instance_group):
        raise _Unreadable("instance groups the reader did not find")
    if not groups:
        edits.insert(top, f"instance_group [{{ count: {new.instance_group[0].count} }}]")
        return
    for block, before, after in zip(groups, old.instance_group, new.instance_group, strict=True):
        if before.count != after.count:
            edits.set_scalar(block, "count", after.count)
