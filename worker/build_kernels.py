"""Builds the worker's compiled CPU kernels ahead of time: `python -m worker.build_kernels`.

A worker builds them on its first start (worker/native.py) where they are missing, ~2 min on a
two-core machine. `make install` (so `make run`'s first start does not wait), `make test` and the
CPU image run this first, so no test and no container start waits on the compiler or is cut off
while it runs; where the kernels are built already it loads them in seconds. Exit 1, naming the
cause, when a module cannot be built.
"""

from __future__ import annotations

import sys
import time

from worker import native
from worker.quant import kernels


def main() -> int:
    for name, load in (("cpu ops", native.load), ("quant ops", kernels.load)):
        print(f"kvledger: {name} kernels: loading, or building (~1 min on two cores)", flush=True)
        start = time.monotonic()
        built = load()
        if built.module is None:
            why = built.reason
            print(f"kvledger: the {name} kernels could not be built: {why}", file=sys.stderr)
            return 1
        took = time.monotonic() - start
        print(f"kvledger: {name} kernels ready in {took:.0f} s ({built.module.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
