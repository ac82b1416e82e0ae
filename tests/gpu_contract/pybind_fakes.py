"""Fakes of pybind11 classes (TensorRT's) that fail wherever the real class would.

TensorRT's objects can only be made on a GPU, so tests of code that uses them need fakes.
A hand-written fake accepts whatever the code under test does; these do not:
``unittest.mock.create_autospec`` refuses attributes the real class lacks, and every call is
matched against the signatures pybind11 writes at the top of each method's docstring
(``get_tensor_shape(self: tensorrt.ICudaEngine, name: str) -> tensorrt.Dims``, numbered
when overloaded): argument count, keywords and types, with pybind's implicit conversions (a
tuple for ``Dims``). What a fake answers is checked against the declared return type too, and
enums and value types (``Dims``, ``DataType``) are the real ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from unittest import mock

_SIGNATURE = re.compile(r"^(?:\d+\. )?(\w*)\((.*)\) -> (.+)$", re.M)
_BUFFER = ("typing_extensions.Buffer", "collections.abc.Buffer", "buffer")
# Results pybind returns as another type: IHostMemory is a buffer; bytes stand in for it.
_STAND_INS: dict[str, tuple[type, ...]] = {"IHostMemory": (bytes, bytearray, memoryview)}


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter: name, annotation text, whether it has a default, how it may be passed."""

    name: str
    annotation: str
    has_default: bool
    positional: bool = True
    keyword: bool = True


@dataclass(frozen=True, slots=True)
class Signature:
    """One pybind11 overload, without ``self``."""

    text: str
    params: tuple[Param, ...]
    returns: str

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        """Arguments by parameter name, or None when the call does not fit this overload."""
        positional = [p for p in self.params if p.positional]
        if len(args) > len(positional):
            return None
        bound = {p.name: value for p, value in zip(positional, args, strict=False)}
        by_name = {p.name: p for p in self.params if p.keyword}
        for name, value in kwargs.items():
            if name not in by_name or name in bound:
                return None
            bound[name] = value
        if any(p.name not in bound and not p.has_default for p in self.params):
            return None
        return bound


def _split(text: str) -> list[str]:
    """Split at top-level commas (defaults like ``<Enum.X: 0>`` and ``list[a, b]`` nest)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "([{<"
        depth -= char in ")]}>"
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return [*parts, tail] if tail else parts


def _params(text: str) -> tuple[Param, ...]:
    params: list[Param] = []
    keyword_only = False
    for part in _split(text)[1:]:  # the first is self (arg0 for properties)
        if part == "*":
            keyword_only = True
            continue
        if part == "/":
            params = [Param(p.name, p.annotation, p.has_default, keyword=False) for p in params]
            continue
        name, _, rest = part.partition(": ")
        annotation, _, default = rest.partition(" = ")
        unnamed = re.fullmatch(r"arg\d+", name) is not None  # pybind's name for a nameless arg
        params.append(Param(name, annotation, bool(default), not keyword_only, not unnamed))
    return tuple(params)


def signatures(member: Any) -> list[Signature]:
    """The overloads pybind11 documents for a method, property getter or setter."""
    doc = getattr(member, "__doc__", None) or ""
    return [
        Signature(match.group(0), _params(match.group(2)), match.group(3).strip())
        for match in _SIGNATURE.finditer(doc)
        if "*args, **kwargs" not in match.group(2)
    ]


class TypeCheck:
    """Does a value pass for an annotation of ``module`` (TensorRT), as pybind11 would take it?

    ``strict`` is for results: pybind's own conversions (tuple to Dims) do not apply.
    Annotations this does not know (``nvonnxparser::IParserError``) pass.
    """

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def fits(self, value: Any, annotation: str, *, strict: bool = False) -> bool:
        annotation = annotation.strip()
        alternatives = _split_union(annotation)
        if len(alternatives) > 1:
            return any(self.fits(value, a, strict=strict) for a in alternatives)
        optional = re.fullmatch(r"(?:typing\.)?Optional\[(.*)\]", annotation)
        if optional:
            return value is None or self.fits(value, optional.group(1), strict=strict)
        generic = re.fullmatch(r"([\w.]+)\[(.*)\]", annotation)
        if generic:
            return self._generic(value, generic.group(1), generic.group(2), strict)
        return self._simple(value, annotation, strict)

    def _generic(self, value: Any, base: str, inner: str, strict: bool) -> bool:
        name = base.rsplit(".", 1)[-1].lower()
        if name not in ("list", "sequence", "tuple"):
            return True
        kinds: tuple[type, ...] = (list,) if strict and name == "list" else (list, tuple)
        if not isinstance(value, kinds):
            return False
        item = _split(inner)[0]
        return all(self.fits(v, item, strict=strict) for v in value)

    def _simple(self, value: Any, annotation: str, strict: bool) -> bool:
        builtin = _BUILTINS.get(annotation)
        if builtin is not None:
            return builtin(value, strict)
        if annotation in _BUFFER:
            return _is_buffer(value)
        cls = getattr(self._module, annotation.rsplit(".", 1)[-1], None)
        if not isinstance(cls, type):
            return True
        return self._instance(value, cls, strict)

    def _instance(self, value: Any, cls: type, strict: bool) -> bool:
        if isinstance(value, (cls, *_STAND_INS.get(cls.__name__, ()))):
            return True
        if value is None:
            return strict  # pybind returns None for a null pointer
        if strict or hasattr(cls, "__members__"):  # enums take no implicit conversion
            return False
        try:
            cls(value)  # an implicit conversion pybind would make (a tuple to Dims)
        except Exception:
            return False
        return True


def _split_union(annotation: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(annotation):
        depth += char in "(["
        depth -= char in ")]"
        if char == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    return [*parts, annotation[start:].strip()]


def _is_int(value: Any, strict: bool) -> bool:
    if strict:
        return isinstance(value, int)
    return not isinstance(value, float | str | bytes) and hasattr(value, "__index__")


def _is_float(value: Any, strict: bool) -> bool:
    return isinstance(value, int | float) and not (strict and isinstance(value, bool))


def _is_str(value: Any, strict: bool) -> bool:
    return isinstance(value, str) or (not strict and isinstance(value, bytes))


def _is_buffer(value: Any) -> bool:
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


_BUILTINS: dict[str, Callable[[Any, bool], bool]] = {
    "None": lambda value, _: value is None,
    "bool": lambda value, _: isinstance(value, bool),
    "int": _is_int,
    "typing.SupportsInt": _is_int,
    "float": _is_float,
    "typing.SupportsFloat": _is_float,
    "str": _is_str,
    "tuple": lambda value, _: isinstance(value, tuple),
    "list": lambda value, _: isinstance(value, list),
    "object": lambda value, _: True,
    "typing.Any": lambda value, _: True,
}


_MISSING = object()


class ApiMismatch(TypeError):
    """A call, an answer or an assignment the real pybind11 class would refuse."""


def check_call(
    owner: str, member: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], types: TypeCheck
) -> Signature:
    """The overload ``args``/``kwargs`` fit; raises ApiMismatch, listing them, if none does."""
    overloads = signatures(member)
    if not overloads:
        raise ApiMismatch(f"{owner} has no pybind11 signature to check a call against")
    for overload in overloads:
        bound = overload.bind(args, kwargs)
        if bound is not None and all(
            types.fits(value, param.annotation)
            for param in overload.params
            if (value := bound.get(param.name, _MISSING)) is not _MISSING
        ):
            return overload
    listed = "\n  ".join(o.text for o in overloads)
    raise ApiMismatch(f"{owner}{_show(args, kwargs)} matches none of:\n  {listed}")


def _show(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(shown)})"


class FakeFactory:
    """Makes checked fakes of ``module``'s classes (``module`` is the real tensorrt)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.types = TypeCheck(module)

    def fake(self, cls: type, **answers: Any) -> Any:
        """A fake instance of ``cls``.

        ``answers`` give, by member name, a property's value or a method's result: a callable
        is called with the method's arguments, anything else is returned as is. A method
        without an answer returns a fake of its declared result class, or None for ``None``;
        for any other result it fails, naming the answer the test must give.
        """
        unknown = sorted(set(answers) - set(dir(cls)))
        if unknown:
            raise AttributeError(f"{cls.__name__} has no {unknown}")
        instance = mock.create_autospec(cls, instance=True, spec_set=True)
        values: dict[str, Any] = {}
        for name in dir(cls):
            member = getattr(cls, name, None)
            if isinstance(member, property):
                self._add_property(instance, cls, name, member, values)
            elif _is_pybind_method(name, member):
                side_effect = self._method(cls, name, member, answers.get(name, _MISSING))
                getattr(instance, name).side_effect = side_effect
        for name, value in answers.items():
            if isinstance(getattr(cls, name, None), property):
                self._check_result(f"{cls.__name__}.{name}", getattr(cls, name).fget, value)
                values[name] = value
        return instance

    def constructor(self, cls: type, make: Callable[..., Any]) -> Callable[..., Any]:
        """Stands in for ``cls`` itself: checks the arguments against ``cls.__init__``."""

        def construct(*args: Any, **kwargs: Any) -> Any:
            check_call(cls.__name__, cls.__init__, args, kwargs, self.types)
            return make(*args, **kwargs)

        return construct

    def _method(self, cls: type, name: str, member: Any, answer: Any) -> Callable[..., Any]:
        owner = f"{cls.__name__}.{name}"

        def call(*args: Any, **kwargs: Any) -> Any:
            overload = check_call(owner, member, args, kwargs, self.types)
            if answer is _MISSING:
                return self._default(owner, overload.returns)
            result = answer(*args, **kwargs) if callable(answer) else answer
            if not self.types.fits(result, overload.returns, strict=True):
                raise ApiMismatch(
                    f"the test's answer {result!r} for {owner} is not a {overload.returns}"
                )
            return result

        return call

    def _default(self, owner: str, returns: str) -> Any:
        if returns == "None":
            return None
        cls = getattr(self.module, returns.rsplit(".", 1)[-1], None)
        if isinstance(cls, type) and not hasattr(cls, "__members__"):
            return self.fake(cls)
        raise AssertionError(f"{owner} was called, but the test gave it no answer ({returns})")

    def _add_property(
        self, instance: Any, cls: type, name: str, prop: property, values: dict[str, Any]
    ) -> None:
        owner = f"{cls.__name__}.{name}"

        def get(_: Any) -> Any:
            if name not in values:  # an unanswered property: a fake of its class, kept
                overloads = signatures(prop.fget)
                values[name] = self._default(owner, overloads[0].returns if overloads else "")
            return values[name]

        def set_(_: Any, value: Any) -> None:
            if prop.fset is None:
                raise AttributeError(f"{owner} is read-only")
            check_call(owner, prop.fset, (value,), {}, self.types)
            values[name] = value

        setattr(type(instance), name, property(get, set_))

    def _check_result(self, owner: str, getter: Any, value: Any) -> None:
        for overload in signatures(getter):
            if not self.types.fits(value, overload.returns, strict=True):
                raise ApiMismatch(f"{owner} = {value!r} is not a {overload.returns}")


def _is_pybind_method(name: str, member: Any) -> bool:
    return not name.startswith("__") and type(member).__name__ in ("instancemethod", "method")
