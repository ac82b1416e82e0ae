"""The GPU check's virtual environment: the machine's Python, and everything it already has.

``--system-site-packages`` makes the base interpreter's packages visible, but where the
machine's Python is itself a virtual environment (a CUDA PyTorch install often is), the
packages live in *that* environment, which a nested one does not see. Its site directories
are then added by a ``.pth`` file (with ``site.addsitedir``, so that their own ``.pth``
files, editable installs among them, work too), after the new environment's own: what the
check installs wins, and everything else (CUDA PyTorch, CuPy, onnxruntime, cuda-bindings)
is the machine's own. Standard library only: this runs before anything is installed.

    python3 -m bench.gpu.venv DIR
"""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

PTH = "_gpu_check_parent.pth"


def parent_site_dirs(prefix: str, base_prefix: str, site_dirs: Sequence[str]) -> list[str]:
    """The running interpreter's site directories when it is a virtual environment."""
    return list(site_dirs) if prefix != base_prefix else []


def create(target: Path) -> None:
    """The environment at ``target`` (pip included where ensurepip is available)."""
    try:
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(target)
    except subprocess.CalledProcessError:  # no ensurepip: the machine's pip stays visible
        venv.EnvBuilder(system_site_packages=True, with_pip=False, clear=True).create(target)
    parents = parent_site_dirs(sys.prefix, sys.base_prefix, site.getsitepackages())
    if parents:
        (_purelib(target) / PTH).write_text(pth_lines(parents))


def pth_lines(directories: Sequence[str]) -> str:
    """``.pth`` lines adding each directory as a site directory, in order (each line is run
    on its own, so each imports ``site``)."""
    return "".join(f"import site; site.addsitedir({d!r})\n" for d in directories)


def _purelib(target: Path) -> Path:
    python = target / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python3 -m bench.gpu.venv DIR", file=sys.stderr)
        return 2
    create(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
