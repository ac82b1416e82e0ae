"""Triton's ``triton`` trace mode: traces written to JSON trace files, as Triton writes them.

A file is one JSON array of records (``trace_records.py``). Triton keeps the traces of each
trace setting (the global one, or a model's own) together until one of three things:

- ``log_frequency`` N > 0 and N traces collected: they go to the next indexed file,
  ``<file>.0``, ``<file>.1``... (one counter per file);
- the setting's ``trace_count`` ran out with every request traced (rate 1) and each of its
  traces collected: to the next indexed file, at once;
- the setting is set again, or the server stops: to the next indexed file where
  ``log_frequency`` is not 0, else appended to ``<file>`` itself, whose array is closed when
  the server stops.

So with the defaults (``log_frequency`` 0, no count) ``<file>`` is written at the stop, as
Triton writes it. The files are written by one thread of their own, never on the event loop;
a file that cannot be written is logged once and its traces dropped: tracing never fails a
request.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

logger = logging.getLogger(__name__)

Record = dict[str, Any]


class TraceFile:
    """One trace file path: its main file (one JSON array, appended to until ``close``)
    and its indexed files. Used from the writer's thread only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._main: IO[str] | None = None
        self._index = 0
        self._failed = False

    def save(self, traces: list[str], indexed: bool) -> None:
        body = ",".join(traces)
        try:
            if indexed:
                name = f"{self.path}.{self._index}"
                self._index += 1
                with open(name, "w", encoding="utf-8") as out:
                    out.write(f"[{body}]")
                return
            if self._main is None:
                self._main = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
                self._main.write("[")
            else:
                self._main.write(",")
            self._main.write(body)
            self._main.flush()
        except OSError as exc:
            if not self._failed:
                self._failed = True
                logger.error("failed creating trace file", extra={"path": self.path,
                                                                 "error": str(exc)})  # fmt: skip

    def close(self) -> None:
        if self._main is not None:
            main, self._main = self._main, None
            try:
                main.write("]")
                main.close()
            except OSError as exc:
                logger.error("failed closing trace file", extra={"path": self.path,
                                                                "error": str(exc)})  # fmt: skip


@dataclass
class Stream:
    """One setting's traces since it was last set: Triton's ``TraceSetting`` stream."""

    log_frequency: int
    traces: list[str] = field(default_factory=list)
    counted: int = 0
    """Traces taken from its count (``TraceSettings.on_counted``)."""
    collected: int = 0
    exhausted: bool = False
    """Its count ran out with every request traced: written once all are collected."""


class TraceFiles:
    """The traces of the process that writes the trace file (the model-owning one: the
    workers send theirs to it). Called on the event loop; writes on its own thread."""

    def __init__(self, path: str) -> None:
        self.file = TraceFile(path)
        self._streams: dict[str, Stream] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="trace-file")
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._down = False
        atexit.register(self.close)

    def next_id(self) -> int:
        """A trace's id, as Triton numbers them: 1, 2, 3... in the order they start."""
        return next(self._ids)

    def collect(self, scope: str, log_frequency: int, records: list[Record]) -> None:
        """A finished trace (its records, children's included) of ``scope``'s setting."""
        text = orjson.dumps(records)[1:-1].decode()  # the records, without their brackets
        with self._lock:
            stream = self._stream(scope, log_frequency)
            stream.traces.append(text)
            stream.collected += 1
            if (stream.exhausted and stream.collected >= stream.counted) or (
                stream.log_frequency and len(stream.traces) >= stream.log_frequency
            ):
                self._save(stream, indexed=True)

    def collect_renumbered(self, scope: str, log_frequency: int, records: list[Record]) -> None:
        """A worker's trace: numbered here, where ids are unique across the processes (in
        the order the traces end, not start)."""
        renumbered: dict[int, int] = {}

        def number(old: int) -> int:
            if old not in renumbered:
                renumbered[old] = self.next_id()
            return renumbered[old]

        for record in records:
            record["id"] = number(record["id"])
            if "parent_id" in record:
                record["parent_id"] = number(record["parent_id"])
        self.collect(scope, log_frequency, records)

    def counted(self, scope: str, last: bool) -> None:
        """A trace was taken from ``scope``'s count; ``last``: it ran out (rate 1)."""
        with self._lock:
            stream = self._stream(scope, 0)
            stream.counted += 1
            stream.exhausted = stream.exhausted or last

    def reset(self, scope: str | None) -> None:
        """``scope``'s setting was set again (None: the global one, and so every model's):
        what it collected is written, as Triton writes a setting's traces when it ends."""
        with self._lock:
            ended = list(self._streams) if scope is None else [scope]
            for name in ended:
                stream = self._streams.pop(name, None)
                if stream is not None:
                    self._save(stream, indexed=stream.log_frequency != 0)

    def drain(self) -> None:
        """Wait until every write asked for so far is done."""
        if not self._down:
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Write what every setting collected and close the file: the server stops."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for stream in self._streams.values():
                self._save(stream, indexed=stream.log_frequency != 0)
            self._streams.clear()
            self._writer.submit(self.file.close)
            self._down = True
        self._writer.shutdown(wait=True)

    def _stream(self, scope: str, log_frequency: int) -> Stream:
        stream = self._streams.get(scope)
        if stream is None:
            stream = self._streams[scope] = Stream(log_frequency)
        elif log_frequency:
            stream.log_frequency = log_frequency
        return stream

    def _save(self, stream: Stream, indexed: bool) -> None:
        traces, stream.traces = stream.traces, []
        if traces and not self._down:  # (a trace that ends after the stop is dropped)
            self._writer.submit(self.file.save, traces, indexed)


Sink = Callable[[str, int, list[Record]], None]
"""Where a finished trace goes: ``TraceFiles.collect``, or a worker's frame to the
model-owning process, which collects it."""
