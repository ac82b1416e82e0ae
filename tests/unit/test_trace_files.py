"""Triton's trace files: when each setting's traces are written and where (``<file>``,
``<file>.N``), what a write that fails does, and a tensor's ``data`` as Triton writes it."""

from __future__ import annotations

import contextvars
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from batchserve.observability.request_trace import RequestTrace, current
from batchserve.observability.trace_files import TraceFiles
from batchserve.observability.trace_records import tensor_data


def _trace(files: TraceFiles, scope: str = "", log_frequency: int = 0) -> int:
    number = files.next_id()
    files.collect(scope, log_frequency, [{"id": number, "model_name": "m", "model_version": 1}])
    return number


def _ids(path: Path) -> list[int]:
    return [record["id"] for record in json.loads(path.read_text())]


def test_without_a_log_frequency_the_traces_go_to_the_file_when_their_setting_ends(
    tmp_path: Path,
) -> None:
    """As Triton: nothing while the setting lasts; appended to one JSON array when it is set
    again, and the array closed at the stop."""
    files = TraceFiles(str(tmp_path / "t.json"))
    _trace(files)
    _trace(files, "own")
    files.reset("own")
    _trace(files)
    files.close()
    assert _ids(tmp_path / "t.json") == [2, 1, 3]
    assert list(tmp_path.iterdir()) == [tmp_path / "t.json"]


def test_a_log_frequency_writes_every_n_traces_to_the_next_indexed_file(tmp_path: Path) -> None:
    files = TraceFiles(str(tmp_path / "t.json"))
    for _ in range(5):
        _trace(files, log_frequency=2)
    _trace(files, "own", log_frequency=3)
    files.close()  # the rest: to indexed files too, as their log frequency is not 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["t.json.0", "t.json.1", "t.json.2", "t.json.3"]
    assert [_ids(tmp_path / name) for name in written] == [[1, 2], [3, 4], [5], [6]]


def test_a_count_that_runs_out_at_rate_1_is_written_once_its_traces_are_in(
    tmp_path: Path,
) -> None:
    """Triton writes them to an indexed file at once, the trace that ran out the count still
    in flight meanwhile."""
    files = TraceFiles(str(tmp_path / "t.json"))
    files.counted("", last=False)
    files.counted("", last=True)
    _trace(files)
    files.drain()
    assert not list(tmp_path.iterdir())
    _trace(files)
    files.drain()
    assert _ids(tmp_path / "t.json.0") == [1, 2]
    files.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0"]


def test_a_worker_s_trace_is_numbered_where_the_file_is_written(tmp_path: Path) -> None:
    files = TraceFiles(str(tmp_path / "t.json"))
    _trace(files)
    files.collect_renumbered("", 0, [{"id": 1, "model_name": "e"}, {"id": 1, "timestamps": []},
                                     {"id": 2, "model_name": "s", "parent_id": 1}])  # fmt: skip
    files.close()
    records = json.loads((tmp_path / "t.json").read_text())
    assert [(r["id"], r.get("parent_id")) for r in records] == [(1, None), (2, None), (2, None),
                                                                (3, 2)]  # fmt: skip


def test_a_file_that_cannot_be_written_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = TraceFiles(str(tmp_path / "missing" / "t.json"))
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            _trace(files, log_frequency=1)
        files.close()
    assert [r.message for r in caplog.records] == ["failed creating trace file"]
    _trace(files, log_frequency=1)  # after the stop: dropped, not raised


@pytest.mark.parametrize(
    ("data", "dtype", "text"),
    [
        (np.array([[1, -2], [3, 4]], np.int32), "INT32", "1,-2,3,4"),
        (np.array([0.5, 1e-8, -3.0], np.float32), "FP32", "0.5,1e-08,-3.0"),
        (np.array([0.1], np.float64), "FP64", "0.1"),
        (np.array([1.5], np.float16), "FP16", "1.5"),
        (np.array([7, 200], np.uint8), "UINT8", "7,200"),
        (np.array([True, False]), "BOOL", "1,0"),
        (np.array([b"a", b'say "hi"', b"\xff"], object), "BYTES", '"a","say ""hi""","\ufffd"'),
        (np.zeros(2, np.uint16), "BF16", ""),
    ],
)
def test_a_tensor_s_data_is_its_elements_separated_by_commas(
    data: np.ndarray, dtype: str, text: str
) -> None:
    """Row-major; numbers exactly (``trace_summary.py`` reads them with ``float``); BYTES
    quoted for a CSV reader (Triton leaves quotes inside bare); BF16 empty, as Triton."""
    assert tensor_data(data, dtype) == text


def test_a_trace_left_from_another_context_does_not_raise() -> None:
    """A stream's request generator may be finalized by another task than the one that
    began its trace: leaving then has nothing to reset, and must not raise."""
    trace = RequestTrace("grpc", "m", tensors=False)
    contextvars.copy_context().run(trace.enter)  # current in a context that is gone
    trace.leave()
    assert current() is None
    trace.enter()
    assert current() is trace
    trace.leave()
    assert current() is None
