"""Read a ``torch.export.save`` archive (``model.pt2``) without running anything it carries.

``torch.export.load`` trusts its file: it unpickles tensors marked ``use_pickle``, custom and
opaque constants and the sample inputs (retrying with ``weights_only=False`` when the safe
load fails), loads AOTInductor shared libraries, ``sympify``s (``eval``) every symbolic
size, pastes tensor and parameter names into the Python source FX ``exec``s, and ``exec``s
the archive's ``guards_code``. So the archive is checked and rewritten before torch sees it:

- only the entries a program needs are accepted (no ``data/aotinductor/``, no legacy files);
- every weight and constant must be a raw tensor record (no pickles, no objects);
- the sample inputs are emptied and ``guards_code`` cleared (nothing left to unpickle or
  ``exec``; the input checks run from the range constraints instead);
- every name FX turns into code must be a plain (dotted) identifier, and every symbolic
  size an arithmetic expression over known sympy functions.

The checked copy is built in memory from one read of the file, so what torch loads is what
was checked (and the file is held in memory once more while the program loads).
"""

from __future__ import annotations

import importlib
import io
import json
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from batchserve.core.errors import ModelConfigError

SCHEMA_MAJOR = 8  # torch.export's serialisation schema (torch 2.11 and 2.13 both write 8.x)
MODEL_JSON = "models/model.json"
INSTALL_HINT = "pip install 'batchserve[export]' (or a CUDA build of torch on a GPU machine)"

NOT_WRITABLE = "The given buffer is not writable"
"""The start of the warning torch 2.11 gives for an archive's weights (``load_program``)."""

_FIXED_ENTRIES = frozenset({"archive_format", "archive_version", "byteorder"})
_RAW_WEIGHT = re.compile(r"data/weights/weight_\d+")
_RAW_CONSTANT = re.compile(r"data/constants/tensor_\d+")
_CONFIGS = {
    "data/weights/model_weights_config.json": re.compile(r"weight_\d+"),
    "data/constants/model_constants_config.json": re.compile(r"tensor_\d+"),
}
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_DOTTED_NAME = re.compile(r"(?:[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)?")
# Fields whose strings FX pastes into generated source, or torch resolves as attributes.
_NAME_FIELDS = frozenset(
    {
        "name", "as_name", "target", "fqn", "class_fqn", "parameter_name", "buffer_name",
        "tensor_constant_name", "custom_obj_name", "user_input_name", "forward_arg_names",
    }
)  # fmt: skip
_TOKEN = re.compile(
    r"\s+|(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<string>'[A-Za-z0-9_.+\-]*')"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>\*\*|//|<=|>=|==|!=|[(),=+\-*/%<>&|~])"
)
_SYMBOL = re.compile(r"[a-z]+\d+")
_SYMPY_NAMES = frozenset(
    {
        "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max",
        "Min", "Abs", "floor", "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
        "Equality", "Unequality", "StrictLessThan", "StrictGreaterThan", "LessThan",
        "GreaterThan", "And", "Or", "Not", "Piecewise", "ExprCondPair", "true", "false",
        "True", "False", "oo", "zoo", "nan", "Infinity", "NegativeInfinity", "NegativeOne",
        "One", "Zero", "Half", "S", "integer", "positive", "negative", "nonnegative",
        "nonpositive", "real", "finite", "infinite", "zero", "nonzero", "rational", "even",
        "odd", "prime", "commutative", "precision", "evaluate",
    }
)  # fmt: skip


def import_torch(model_file: Path) -> Any:
    """The torch module, or ModelConfigError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ModelConfigError(
            f"{model_file}: serving a PyTorch program (.pt2) needs torch, which is not "
            f"installed: {INSTALL_HINT}"
        ) from None
    return torch


def load_program(model_file: Path) -> Any:
    """The ``ExportedProgram`` in ``model_file``, loaded from its checked copy."""
    torch = import_torch(model_file)
    checked = checked_archive(model_file, torch_sympy_names())
    try:
        with warnings.catch_warnings():
            # torch 2.11 maps the archive's weights from its read-only bytes and warns that
            # they are not writable; an inference program never writes its weights.
            warnings.filterwarnings("ignore", NOT_WRITABLE, UserWarning)
            return torch.export.load(checked)
    except Exception as exc:
        message = " ".join(str(exc).split())[:500]
        raise ModelConfigError(
            f"{model_file}: torch {torch.__version__} cannot load this program: "
            f"{type(exc).__name__}: {message}"
        ) from None


def checked_archive(model_file: Path, functions: frozenset[str] = frozenset()) -> io.BytesIO:
    """A copy of the archive torch may load; ModelConfigError naming the entry at fault.

    ``functions`` are further names a symbolic size may call (torch's sympy functions).
    """
    try:
        with zipfile.ZipFile(model_file) as archive:
            return _Rewrite(model_file, archive, functions).run()
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelConfigError(
            f"{model_file}: not a readable torch.export archive (model.pt2 is written by "
            f"torch.export.save): {exc}"
        ) from None


class _Rewrite:
    """One pass over the archive: check each entry as it is read, write the checked copy."""

    def __init__(self, path: Path, archive: zipfile.ZipFile, functions: frozenset[str]) -> None:
        self.path, self.archive, self.functions = path, archive, functions
        self.seen: set[str] = set()

    def run(self) -> io.BytesIO:
        root = _root(self.path, self.archive.namelist())
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as copy:
            for info in self.archive.infolist():
                relative = info.filename[len(root) + 1 :]
                copy.writestr(info.filename, self._checked(relative, info))
        missing = sorted({MODEL_JSON, _SAMPLE_INPUTS, *_CONFIGS} - self.seen)
        if missing:
            self._refuse(missing[0], "is missing: this is not an archive of torch.export.save")
        out.seek(0)
        return out

    def _checked(self, relative: str, info: zipfile.ZipInfo) -> bytes:
        self.seen.add(relative)
        if relative == _SAMPLE_INPUTS:
            return b""  # a pickle torch would unpickle; the program runs without it
        data = self.archive.read(info)
        if relative == MODEL_JSON:
            return self._program(data)
        if relative in _CONFIGS:
            self._payloads(relative, data)
        elif not _plain_entry(relative):
            self._refuse(relative, _why_refused(relative))
        elif relative == "archive_format" and data != b"pt2":
            self._refuse(relative, f"says {data[:16]!r}, not b'pt2'")
        return data

    def _program(self, data: bytes) -> bytes:
        document = self._json(MODEL_JSON, data)
        version = document.get("schema_version")
        major = version.get("major") if isinstance(version, dict) else None
        if major != SCHEMA_MAJOR:
            self._refuse(
                MODEL_JSON,
                f"uses serialisation schema {major}; batchserve checks schema {SCHEMA_MAJOR} "
                "(torch 2.11 to 2.13): re-export it with one of those",
            )
        for field, value in _strings(document):
            self._string(field, value)
        document["guards_code"] = []  # Python source torch would exec; sizes are checked anyway
        return json.dumps(document).encode()

    def _string(self, field: str, value: str) -> None:
        if field in _NAME_FIELDS and not _DOTTED_NAME.fullmatch(value):
            self._refuse(MODEL_JSON, f"{field} {value[:80]!r} is not a plain (dotted) name")
        if field == "as_operator" and not value.startswith("torch.ops."):
            self._refuse(MODEL_JSON, f"operator argument {value[:80]!r} is not a torch op")
        if field == "expr_str":
            problem = expression_problem(value, self.functions)
            if problem:
                self._refuse(MODEL_JSON, f"symbolic size {value[:80]!r}: {problem}")
        if field == "in_spec" and not all(map(_DOTTED_NAME.fullmatch, _spec_keys(value))):
            self._refuse(MODEL_JSON, "names a keyword input with something other than a name")

    def _payloads(self, relative: str, data: bytes) -> None:
        pattern = _CONFIGS[relative]
        config = self._json(relative, data).get("config")
        if not isinstance(config, dict):
            self._refuse(relative, "has no 'config' mapping")
        for fqn, payload in config.items():
            entry = payload if isinstance(payload, dict) else {}
            path_name = str(entry.get("path_name", ""))
            if entry.get("use_pickle") is not False or not pattern.fullmatch(path_name):
                self._refuse(
                    relative,
                    f"'{fqn}' is stored as a pickled object ({path_name or 'no path'}); "
                    "batchserve loads raw tensor records only",
                )

    def _json(self, relative: str, data: bytes) -> dict[str, Any]:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            self._refuse(relative, f"is not JSON: {exc}")
        if not isinstance(document, dict):
            self._refuse(relative, "is not a JSON object")
        return document

    def _refuse(self, relative: str, problem: str) -> NoReturn:
        raise ModelConfigError(f"{self.path}: archive entry {relative} {problem}; not loaded")


def expression_problem(text: str, functions: frozenset[str] = frozenset()) -> str:
    """Why ``text`` is not a plain sympy arithmetic expression ('' when it is).

    Only numbers, short quoted names, operators, size symbols (``s0``, ``u1``), sympy's
    core names and the given ``functions`` pass: no attributes, subscripts or builtins.
    """
    names = _SYMPY_NAMES | functions
    position = 0
    while position < len(text):
        token = _TOKEN.match(text, position)
        if token is None:
            return f"unexpected {text[position : position + 10]!r}"
        name = token.group("name")
        if name is not None and name not in names and not _SYMBOL.fullmatch(name):
            return f"'{name}' is not a sympy function torch uses"
        position = token.end()
    return ""


def _root(path: Path, names: list[str]) -> str:
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or any("/" not in name for name in names):
        raise ModelConfigError(
            f"{path}: not a torch.export archive (every entry of one is under one folder)"
        )
    return roots.pop()


def _plain_entry(relative: str) -> bool:
    return (
        relative in _FIXED_ENTRIES
        or relative.startswith((".data/", "extra/"))
        or bool(_RAW_WEIGHT.fullmatch(relative) or _RAW_CONSTANT.fullmatch(relative))
    )


def _why_refused(relative: str) -> str:
    if relative.startswith("data/aotinductor/"):
        return (
            "is an AOTInductor build (compiled native code, which batchserve never loads); "
            "save the program itself with torch.export.save"
        )
    if relative.startswith("models/"):
        return "is a second program; batchserve serves archives holding one, named 'model'"
    return "is not part of a torch.export program (pickles and native code are refused)"


def _strings(node: object, field: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a JSON document with the field that holds it (list items inherit it)."""
    if isinstance(node, str):
        yield field, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, field)


def _spec_keys(text: str) -> Iterator[str]:
    """Every key in a serialised pytree spec (FX pastes the input spec's keyword names into
    the forward it generates); a spec that does not parse yields one that fails the check."""
    try:
        node = json.loads(text)
    except ValueError:
        yield "'"
        return
    for field, context in _strings(node):
        if field == "context":
            yield from _context_keys(context)


def _context_keys(context: str) -> Iterator[str]:
    try:
        decoded = json.loads(context)
    except ValueError:
        yield context  # not JSON: a plain name (a type's), checked as one
        return
    for _, key in _strings(decoded):
        yield key


def torch_sympy_names() -> frozenset[str]:
    """The sympy function classes torch's own symbolic sizes are written with."""
    sympy = importlib.import_module("sympy")
    functions = importlib.import_module("torch.utils._sympy.functions")
    return frozenset(
        name
        for name, value in vars(functions).items()
        if isinstance(value, type) and issubclass(value, sympy.Basic)
    )
