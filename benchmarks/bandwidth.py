"""The memory-bandwidth bound of a decode step at one stream, measured on this machine.

    .venv/bin/python benchmarks/bandwidth.py [GGUF] [--threads N]

At concurrency 1 a decode step reads every weight once (a tied embedding's head reads the whole
matrix), so tokens/s cannot exceed (read bandwidth / bytes of weights). The bandwidth is measured
as a reader does it: the best of several `sum()`s of a 1 GiB float32 buffer (far larger than
any cache) on the threads the engines use. benchmarks/peers prints each engine's c=1 rate as
a fraction of that bound for the GGUF sizes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

BUFFER_BYTES = 1 << 30


def read_bandwidth(threads: int, repeats: int = 7) -> float:
    """Bytes/s of a streaming read on `threads` threads (best of `repeats`)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(BUFFER_BYTES // 4)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - start)
        return BUFFER_BYTES / best
    finally:
        torch.set_num_threads(saved)


def weight_bytes(gguf: Path) -> int:
    """Bytes of every tensor in a GGUF file (what one decode step streams)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="?", type=Path)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    bw = read_bandwidth(args.threads)
    print(f"read bandwidth, {args.threads} threads: {bw / 1e9:.1f} GB/s")
    if args.gguf:
        size = weight_bytes(args.gguf)
        print(
            f"{args.gguf.name}: {size / 2**20:.0f} MiB of weights: c=1 bound {bw / size:.1f} tok/s"
        )


if __name__ == "__main__":
    main()
