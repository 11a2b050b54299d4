"""Hand the C heap's free pages back to the OS once a model is loaded.

Loading leaves freed scratch behind on glibc's heap: dequantized slices, conversions, the
checkpoint's copies. glibc returns free memory to the OS only from the heap's top, so a freed
block below a live one stays resident, and the KV pool, allocated next, stacks on top of it:
a greedy screen's norms kept as small tensors once pinned a few hundred MiB that way on
SmolLM2's head (worker/layers/int8_screen.py; docs/performance.md, "Memory"). `malloc_trim(0)`
releases every free page of every arena, wherever it lies (glibc 2.8+), quickly next to a
model's load; `KVCache.allocate` calls it before it zeroes the pool
(worker/runner/kv_cache.py), so the pool is not counted on top of scratch.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError, TypeError):
        return None  # not glibc (musl, macOS): nothing to trim this way
    return libc


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS; False where the C library cannot (not glibc)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
