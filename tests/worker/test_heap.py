"""The worker hands the C heap's free pages back before it allocates the KV pool
(worker/runner/heap.py): freed load-time scratch below a live block would otherwise stay
resident under the pool."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import worker.runner.kv_cache as kv_cache
from tests.serving import REPO
from tests.worker.helpers import make_runner
from worker.runner.heap import _libc, release_free_heap

# A fresh process fragments glibc's heap on purpose: 200 blocks of 1 MiB, written, each with a
# small block kept above it, then the large ones freed. glibc keeps them (they are not at the
# heap's top); the trim must return them. Prints the resident MiB before and after the trim.
FRAGMENTED = """
import ctypes, ctypes.util
from worker.runner.heap import release_free_heap
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
assert libc.mallopt(-3, 64 << 20) and libc.mallopt(-1, 1 << 30)  # mmap, trim thresholds
def rss():
    return next(int(l.split()[1]) >> 10 for l in open("/proc/self/status") if l.startswith("VmRSS"))
large, kept = [], []
for _ in range(200):
    large.append(libc.malloc(1 << 20)); libc.memset(large[-1], 1, 1 << 20)
    kept.append(libc.malloc(64))
for p in large:
    libc.free(p)
before = rss()
assert release_free_heap()
print(before, rss())
"""


@pytest.mark.skipif(_libc() is None, reason="malloc_trim is glibc's")
def test_free_pages_below_live_blocks_go_back_to_the_os() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = map(int, done.stdout.split())
    assert before - after >= 150, (before, after)  # ~200 MiB freed below live blocks


def test_the_runner_trims_once_as_it_allocates_its_pool(tiny_llama_dir, monkeypatch) -> None:  # noqa: ANN001
    """`KVCache.allocate` trims before it zeroes the pool; the runner allocates one pool."""
    calls: list[int] = []

    def trimmed() -> bool:
        calls.append(len(calls))
        return release_free_heap()

    monkeypatch.setattr(kv_cache, "release_free_heap", trimmed)
    shape = kv_cache.KVShape(2, 16, 1, 8, torch.float32)
    assert kv_cache.KVCache.allocate(shape, 4, torch.device("cpu")).num_blocks == 4
    assert calls == [0]
    runner = make_runner(tiny_llama_dir)
    assert calls == [0, 1] and runner.kv_cache.num_blocks == runner.num_blocks
