"""utils/openmp.py: a thread's OpenMP workers are freed, and torch still computes after."""

import os
import threading

import pytest
import torch

from trinity.utils import openmp


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_release_workers_frees_this_threads_pool(monkeypatch):
    if not openmp._pauses():
        pytest.skip("torch runs without a pausable OpenMP runtime here")
    monkeypatch.setattr(openmp, "_shared", True)  # as in a `both` stage in one process
    x = torch.randn(1_000_000)
    counts = {}

    def worker() -> None:
        torch.set_num_threads(2)
        x.exp().sum()  # a parallel region: this thread's pool gets a worker
        counts["after_op"] = _threads()
        openmp.release_workers()
        counts["after_release"] = _threads()
        (x * 2).exp().sum()
        openmp.share_cores(False)  # roles not taking turns: the workers stay
        counts["kept"] = _threads()
        openmp.release_workers()
        counts["kept_after_release"] = _threads()
        counts["result"] = float(x.exp().sum())  # new workers start on demand

    before = torch.get_num_threads()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    torch.set_num_threads(before)
    # the worker thread's pool held one OpenMP thread beside it; the release joined it
    assert counts["after_release"] == counts["after_op"] - 1
    assert counts["kept_after_release"] == counts["kept"] == counts["after_op"]
    assert counts["result"] == pytest.approx(float(x.exp().sum()), rel=1e-4)


def test_release_workers_without_a_runtime_does_nothing(monkeypatch):
    openmp._pauses.cache_clear()
    monkeypatch.setattr(openmp, "_RUNTIMES", ("libnothing-such",))
    try:
        openmp.release_workers()  # no runtime found: a no-op, no error
        assert openmp._pauses() == ()
    finally:
        openmp._pauses.cache_clear()
