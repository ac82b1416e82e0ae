"""Generate and build stub GPU libraries from what the real Python packages link against.

The GPU wheels (onnxruntime-gpu's CUDA and TensorRT providers, TensorRT's bindings) cannot be
loaded without CUDA, cuDNN and TensorRT's own libraries, which need a GPU. This reads each
consumer's ELF dynamic section with binutils (``readelf``, ``nm``), finds every C symbol it
takes from those libraries (with the symbol version it binds), and builds a library per
soname whose functions answer "no device". Functions that must return a pointer, fill an
out-parameter or do nothing are written by hand in ``templates/<family>.c``; a symbol that
looks like one of those but has no hand-written body stops the build, so a new package
version cannot slip a small int where a pointer is expected.

Usage: python gen_stubs.py --out DIR [--cuda-bindings DIR] [--also SONAME] CONSUMER.so...
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True, slots=True)
class Family:
    """One stubbed library, whatever its soname's major version.

    Args:
        stem: soname without the version, e.g. ``libcudart.so``.
        prefix: regex matching the C symbols this library exports (for unversioned symbols).
        error: what a generated function returns ("no device", "not initialized"); None when
            every function must be hand-written (they return pointers).
    """

    stem: str
    prefix: str
    error: int | None

    @property
    def template(self) -> Path:
        return TEMPLATES / f"{self.stem.removeprefix('lib').removesuffix('.so')}.c"


# Order matters: the first family whose prefix matches an unversioned symbol takes it.
FAMILIES = (
    Family("libcudart.so", r"cuda[A-Z]|__cuda", 100),  # cudaErrorNoDevice
    Family("libcuda.so", r"cu[A-Z]", 100),  # CUDA_ERROR_NO_DEVICE
    Family("libcublasLt.so", r"cublasLt", 1),  # CUBLAS_STATUS_NOT_INITIALIZED
    Family("libcublas.so", r"cublas", 1),
    Family("libcurand.so", r"curand", 101),  # CURAND_STATUS_NOT_INITIALIZED
    Family("libcufft.so", r"cufft", 5),  # CUFFT_SETUP_FAILED
    Family("libcudnn.so", r"cudnn", 1001),  # CUDNN_STATUS_NOT_INITIALIZED
    Family("libnvonnxparser.so", r"createNvOnnxParser|getNvOnnxParser", None),
    Family("libnvinfer_plugin.so", r"initLibNvInferPlugins|getPluginCreator", None),
    Family("libnvinfer.so", r"createInfer|getInferLibVersion|get\w*PluginRegistry", None),
)
# Names of functions that return a pointer or fill an out-parameter: never generated.
NEEDS_TEMPLATE = re.compile(r"String$|Name$|Registry$|_INTERNAL$|Version$|^__cuda|ProcAddress")
PYTHON_SYMBOL = re.compile(r"_?Py")


@dataclass(slots=True)
class Stub:
    """What one stub library must export, and the symbol version its consumers bind."""

    soname: str
    family: Family
    symbols: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)

    @property
    def major(self) -> int:
        return int(self.soname.rsplit(".so.", 1)[1].split(".")[0])


def run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def family_of_soname(soname: str) -> Family | None:
    stem = soname.split(".so", 1)[0] + ".so"
    return next((f for f in FAMILIES if f.stem == stem), None)


def needed(path: Path) -> list[str]:
    """DT_NEEDED entries, in order."""
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", str(path)))


def version_files(path: Path) -> dict[str, str]:
    """Symbol version name -> the library file that defines it (``.gnu.version_r``)."""
    files: dict[str, str] = {}
    current = ""
    for line in run("readelf", "-V", "--wide", str(path)).splitlines():
        if match := re.search(r"File: (\S+)", line):
            current = match.group(1)
        elif match := re.search(r"Name: (\S+)", line):
            files[match.group(1)] = current
    return files


def undefined(path: Path) -> list[tuple[str, str]]:
    """Strongly undefined dynamic symbols as (name, version or "")."""
    symbols = []
    for line in run("nm", "-D", "--undefined-only", str(path)).splitlines():
        kind, _, symbol = line.strip().partition(" ")
        if kind == "U":
            name, _, version = symbol.partition("@")
            symbols.append((name, version.lstrip("@")))
    return symbols


def defined(path: Path | str) -> set[str]:
    """Dynamic symbols ``path`` exports."""
    rows = run("nm", "-D", "--defined-only", str(path)).splitlines()
    return {row.split()[-1].split("@")[0] for row in rows if row.strip()}


def system_symbols(path: Path, stubbed: set[str]) -> set[str]:
    """Symbols the found, non-stubbed libraries ``path`` needs define (libc, libstdc++...)."""
    found: set[str] = set()
    for line in run("ldd", str(path)).splitlines():
        match = re.match(r"\s*(\S+) => (/\S+)", line)
        if match and match.group(1) not in stubbed:
            found |= defined(match.group(2))
    return found


def collect(consumers: list[Path], also: list[str]) -> dict[str, Stub]:
    """Every stub library the consumers need, with the symbols each takes from it, and the
    ``also`` sonames (libraries opened by name at run time, like the CUDA driver)."""
    stubs: dict[str, Stub] = {}
    siblings = set().union(*(defined(consumer) for consumer in consumers))
    for soname in also:
        family = family_of_soname(soname)
        if family is None:
            sys.exit(f"{soname}: not a library this generator can stub")
        stubs[soname] = Stub(soname, family)
    for consumer in consumers:
        mine = _stubs_needed_by(consumer, stubs)
        if mine:
            _assign_symbols(consumer, mine, siblings)
    return stubs


def _stubs_needed_by(consumer: Path, stubs: dict[str, Stub]) -> list[Stub]:
    mine = []
    for soname in needed(consumer):
        family = family_of_soname(soname)
        if family is not None:
            mine.append(stubs.setdefault(soname, Stub(soname, family)))
    return mine


def _assign_symbols(consumer: Path, mine: list[Stub], siblings: set[str]) -> None:
    """Give each symbol ``consumer`` takes from a stubbed library to that library's stub.

    ``siblings`` are what the other consumers define: a host library (onnxruntime's
    providers_shared) loads them first, so they are not looked for anywhere else.
    """
    by_soname = {stub.soname: stub for stub in mine}
    files = version_files(consumer)
    system = system_symbols(consumer, set(by_soname)) | siblings
    unknown = []
    for name, version in undefined(consumer):
        target = by_soname.get(files.get(version, ""))
        if target is not None:
            target.symbols.add(name)
            target.versions.add(version)
        elif not version and (owner := _owner(name, mine)) is not None:
            owner.symbols.add(name)
        elif not version and name not in system and not PYTHON_SYMBOL.match(name):
            unknown.append(name)
    if unknown:
        sys.exit(f"{consumer}: no library provides {sorted(unknown)}; add a family for them")


def _owner(name: str, mine: list[Stub]) -> Stub | None:
    for family in FAMILIES:
        if re.match(family.prefix, name):
            return next((stub for stub in mine if stub.family == family), None)
    return None


def template_functions(source: str) -> set[str]:
    """Names of the non-static functions a template defines."""
    pattern = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{]*\)\s*\{", re.M)
    return set(pattern.findall(source))


def pointer_returns(cuda_bindings: Path | None) -> set[str]:
    """CUDA functions that return a pointer, from cuda-bindings' declarations (.pxd)."""
    if cuda_bindings is None:
        return set()
    names: set[str] = set()
    for pxd in ("cyruntime.pxd", "cydriver.pxd"):
        text = (cuda_bindings / pxd).read_text()
        names |= set(re.findall(r"^cdef [\w ]*\*\s*(\w+)\(", text, re.M))
    return names


def source(stub: Stub, pointers: set[str]) -> str:
    """The stub's C source: its template, then a default body for every other symbol."""
    template = stub.family.template.read_text() if stub.family.template.exists() else ""
    written = template_functions(template)
    missing = sorted(stub.symbols - written)
    risky = [n for n in missing if NEEDS_TEMPLATE.search(n) or n in pointers]
    if risky or (missing and stub.family.error is None):
        sys.exit(f"{stub.soname}: write {risky or missing} by hand in {stub.family.template}")
    lines = [f"/* Generated by gen_stubs.py for {stub.soname}: do not edit. */", template]
    lines += [f"int {name}(void) {{ return {stub.family.error}; }}" for name in missing]
    return "\n".join(lines) + "\n"


def build(stub: Stub, pointers: set[str], cuda_major: int, out: Path) -> Path:
    """Compile the stub into ``out/<soname>``, with its symbol version if one is bound."""
    c_file = out / "src" / f"{stub.soname}.c"
    c_file.parent.mkdir(parents=True, exist_ok=True)
    c_file.write_text(source(stub, pointers))
    command = ["cc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror"]
    command += [f"-DSTUB_MAJOR={stub.major}", f"-DSTUB_CUDA_MAJOR={cuda_major}"]
    command += ["-I", str(TEMPLATES), f"-Wl,-soname,{stub.soname}", "-o", str(out / stub.soname)]
    if len(stub.versions) > 1:
        sys.exit(f"{stub.soname}: consumers bind several versions {sorted(stub.versions)}")
    if stub.versions:
        script = c_file.with_suffix(".map")
        script.write_text(f"{next(iter(stub.versions))} {{ global: *; }};\n")
        command.append(f"-Wl,--version-script={script}")
    run(*command, str(c_file), "-ldl")
    return out / stub.soname


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cuda-bindings", type=Path, help="cuda/bindings of cuda-bindings")
    parser.add_argument("--also", action="append", default=[], help="a soname to build anyway")
    parser.add_argument("consumers", type=Path, nargs="+")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pointers = pointer_returns(args.cuda_bindings)
    stubs = collect(args.consumers, args.also)
    cudart = [s.major for s in stubs.values() if s.family.stem == "libcudart.so"]
    for stub in stubs.values():
        built = build(stub, pointers, max(cudart, default=13), args.out)
        print(f"{built.name}: {len(stub.symbols)} symbols {sorted(stub.versions)}")


if __name__ == "__main__":
    main()
