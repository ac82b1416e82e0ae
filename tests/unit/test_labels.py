"""Label files as Triton reads them, and the ones a model may not use."""

import os
from pathlib import Path

import pytest
from batchserve.models import labels as labels_module
from batchserve.models.labels import read_labels
from batchserve.proto.model_config_pb2 import ModelOutput

SOURCE = "m/config.pbtxt"


def outputs(**files: str) -> list[ModelOutput]:
    return [ModelOutput(name=name, label_filename=file) for name, file in files.items()]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"cat\ndog\n", (b"cat", b"dog")),
        (b"cat\ndog", (b"cat", b"dog")),  # no newline after the last line
        (b"cat\n\ndog\n\n", (b"cat", b"", b"dog", b"")),  # empty lines keep their place
        (b"a b\r\n\xff\n", (b"a b\r", b"\xff")),  # lines end at \n only; bytes as written
        (b"", ()),
    ],
)
def test_one_label_per_line(tmp_path: Path, content: bytes, expected: tuple[bytes, ...]) -> None:
    (tmp_path / "labels.txt").write_bytes(content)
    assert read_labels(outputs(prob="labels.txt"), tmp_path, source=SOURCE) == (
        {"prob": expected},
        [],
    )


def test_outputs_without_a_label_file_have_no_labels(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "l.txt").write_bytes(b"x\n")
    found, problems = read_labels(outputs(a="", b="sub/l.txt"), tmp_path, source=SOURCE)
    assert (found, problems) == ({"b": (b"x",)}, [])


def field(name: str, file: str) -> str:
    return f"m/config.pbtxt: output '{name}': label_filename '{file}'"


def test_a_missing_file_is_a_problem_naming_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    found, problems = read_labels(outputs(a="none.txt", b="dir"), tmp_path, source=SOURCE)
    assert found == {}
    assert problems == [
        f"{field('a', 'none.txt')}: does not exist or is not a file",
        f"{field('b', 'dir')}: does not exist or is not a file",
    ]


def test_files_outside_the_model_directory_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "secret").write_bytes(b"s\n")
    (model / "link.txt").symlink_to(tmp_path / "secret")
    files = {"a": "../secret", "b": str(tmp_path / "secret"), "c": "link.txt", "d": "."}
    found, problems = read_labels(outputs(**files), model, source=SOURCE)
    assert found == {}
    assert problems == [f"{field(n, f)}: is outside the model directory" for n, f in files.items()]


def test_an_unreadable_file_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(b"a\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # running as root: permissions do not apply
        pytest.skip("file permissions are not enforced for this user")
    _, problems = read_labels(outputs(p="labels.txt"), tmp_path, source=SOURCE)
    assert problems == [f"{field('p', 'labels.txt')}: cannot be read: Permission denied"]


def test_an_oversized_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labels_module, "MAX_LABEL_FILE_BYTES", 4)
    (tmp_path / "l.txt").write_bytes(b"abcd\n")
    _, problems = read_labels(outputs(p="l.txt"), tmp_path, source=SOURCE)
    assert problems == [
        f"{field('p', 'l.txt')}: is larger than 4 bytes (the limit on a label file)"
    ]
