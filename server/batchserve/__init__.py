"""batchserve: an inference server for CNN and RNN models speaking the KServe v2 protocol.

``batchserve.Server`` runs the server inside a Python process, without sockets
(``runtime/in_process.py``). It is imported on first use, so the ``batchserve`` command and
every module that reads ``__version__`` import no more than before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from batchserve.runtime.in_process import Server as Server

__all__ = ["Server", "__version__"]


def __getattr__(name: str) -> object:
    if name == "Server":
        from batchserve.runtime.in_process import Server

        return Server
    raise AttributeError(f"module 'batchserve' has no attribute {name!r}")
