"""What `make gpu-check` installs: the project's dependencies and the few the check adds.

Read by both scripts with nothing but the standard library and ``packaging`` (pip's own copy
where the interpreter has no other): ``scripts/gpu_wheelhouse.sh`` downloads these on a
networked machine, and ``scripts/gpu_check.sh`` asks which of them the GPU machine's Python
lacks before it installs anything from the wheelhouse.

    python -m bench.gpu.requirements [--build] [--unmet]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare interpreter: pip vendors the same library
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
CHECK_EXTRAS = ("pytest>=8", "httpx>=0.27")
"""What the GPU tests and the benchmark need beyond the server's and the client's own
dependencies (the load generator uses the project's client, which brings httpx and grpcio)."""


CLIENTS = ("tritonclient[http,grpc]>=2.50",)
"""What the GPU-marked integration tests import beside the project: NVIDIA's own client, whose
CUDA shared-memory examples they run. Installed from the wheelhouse's ``clients/`` folder,
only what the machine lacks, without resolving (``missing_wheels``): its pin of ml-dtypes
must not replace the machine's own, and a client that cannot install fails only those tests."""


def _pyproject(directory: Path) -> dict[str, object]:
    with (directory / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def runtime() -> list[str]:
    """The server's and the client's dependencies, then the check's own."""
    server = _pyproject(ROOT)["project"]
    client = _pyproject(CLIENT)["project"]
    assert isinstance(server, dict)
    assert isinstance(client, dict)
    return _unique([*server["dependencies"], *client["dependencies"], *CHECK_EXTRAS])


def build() -> list[str]:
    """The build backend both packages need (setuptools, wheel), for an offline editable
    install with build isolation."""
    system = _pyproject(ROOT)["build-system"]
    assert isinstance(system, dict)
    return list(system["requires"])


def _unique(texts: Iterable[str]) -> list[str]:
    """One requirement per distribution (and marker): repeats merge specifiers and extras."""
    merged: dict[tuple[str, str], Requirement] = {}
    for text in texts:
        requirement = Requirement(text)
        key = (canonicalize_name(requirement.name), str(requirement.marker or ""))
        if key not in merged:
            merged[key] = requirement
            continue
        kept = merged[key]
        kept.specifier &= requirement.specifier
        kept.extras |= requirement.extras
    return [str(requirement) for requirement in merged.values()]


def unmet(requirements: Sequence[str], installed: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each requirement the installed versions do not satisfy, with why (top level only:
    pip resolves what those need in turn). ``installed`` maps canonical names to versions."""
    found = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = installed.get(canonicalize_name(requirement.name))
        if version is None:
            found.append((text, "not installed"))
        elif not requirement.specifier.contains(version, prereleases=True):
            found.append((text, f"{version} installed"))
    return found


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of every distribution this interpreter can import."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def missing_wheels(wheels: Iterable[Path], installed: Mapping[str, str]) -> list[Path]:
    """The wheels whose distribution is not installed at all (a wheel's file name begins
    with its distribution's name, then ``-`` and the version)."""
    return [w for w in sorted(wheels) if canonicalize_name(w.name.split("-")[0]) not in installed]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.requirements")
    parser.add_argument("--build", action="store_true", help="the build backend's requirements")
    parser.add_argument("--clients", action="store_true", help="the GPU tests' clients")
    parser.add_argument("--unmet", action="store_true", help="only those not satisfied here")
    parser.add_argument(
        "--missing-wheels", type=Path, metavar="DIR", help="the wheels in DIR not installed here"
    )
    args = parser.parse_args(argv)
    if args.missing_wheels is not None:
        found = missing_wheels(args.missing_wheels.glob("*.whl"), installed_versions())
        print("\n".join(str(path) for path in found))
        return 0
    wanted = build() if args.build else list(CLIENTS) if args.clients else runtime()
    if not args.unmet:
        print("\n".join(wanted))
        return 0
    for text, why in unmet(wanted, installed_versions()):
        print(f"{text}\t{why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
