"""glibc malloc settings (``trinity/utils/allocator.py``): a freed tensor-sized block is reused
by the next allocation instead of being mapped afresh, page fault by page fault."""

import json
import os
import platform
import subprocess
import sys

import pytest

from trinity.utils import allocator

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# In a fresh process (the arena limit holds only before a second thread allocates): tune or
# not, then malloc a 64 MiB block in a thread (as torch's CPU allocator does), write it, free
# it, 5 times; the page faults of the last 4.
CHILD = """
import ctypes, json, resource, threading
from trinity.utils import allocator
taken = allocator.tune()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def work():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        block = libc.malloc(64 << 20)
        ctypes.memset(block, 1, 64 << 20)
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(json.dumps({"taken": taken, "faults": sum(faults[1:])}))
"""


def child(environ: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_freed_block_is_reused_without_page_faults():
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    tuned = child({**base, "TRINITY_MALLOC": "tuned"})
    default = child({**base, "TRINITY_MALLOC": "default"})
    assert tuned["taken"] and not default["taken"]
    pages = 4 * (64 << 20) // 4096  # 4 blocks of 64 MiB, in 4 KiB pages
    # glibc's defaults map each 64 MiB block afresh: a fault per page, every time
    assert default["faults"] > pages // 2
    assert tuned["faults"] < pages // 20


@glibc
def test_the_settings_go_to_new_processes_unless_opted_out(monkeypatch):
    monkeypatch.delenv("TRINITY_MALLOC", raising=False)
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    assert allocator.env() == {
        "MALLOC_ARENA_MAX": "1",
        "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
        "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
        "MALLOC_TOP_PAD_": str(1 << 28),
    }
    monkeypatch.setenv("TRINITY_MALLOC", "default")
    assert allocator.env() == {} and allocator.tune() is False
    monkeypatch.delenv("TRINITY_MALLOC")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the user's own glibc tunable: left alone
    assert allocator.env() == {}


@glibc
def test_a_process_started_with_the_settings_passes_them_on(monkeypatch):
    """An actor that starts actors (the explorer its engines) hands on what it started with."""
    monkeypatch.delenv("TRINITY_MALLOC", raising=False)
    settings = allocator.env()
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    assert settings and allocator.env() == settings
    assert allocator.tune() is False  # already in force from the start: nothing to set
