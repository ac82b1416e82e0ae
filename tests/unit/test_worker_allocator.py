"""A worker's allocator: one glibc arena shared by every thread, as the model-owning process
has. Measured in a fresh process set up as a worker is, by glibc's own ``malloc_info``."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")

PROGRAM = """
import ctypes, os, re, sys, tempfile, threading
from batchserve.core.settings import Settings
from batchserve.runtime.worker_process import tune_process
if sys.argv[1] == "worker":
    tune_process(Settings(cpu_scheduling="normal"))
held = []
def allocate():  # as grpc's threads do: each thread's own buffers, kept a while
    held.append([bytearray(200_000) for _ in range(20)])
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = tempfile.NamedTemporaryFile(delete=False).name
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(len(re.findall('<heap nr=', open(path).read())))
os.remove(path)
"""


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_workers_threads_share_one_arena() -> None:
    assert _arenas("plain") > 1  # glibc's default: threads take arenas of their own
    assert _arenas("worker") == 1
