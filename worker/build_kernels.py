"""Builds the worker's compiled CPU kernels ahead of time: `python -m worker.build_kernels`.

A worker builds them on its first start (worker/native.py), which takes a minute or more on a
busy two-core machine. `make test` and the CPU image run this first, so no test and no container
start waits on the compiler or is cut off while it runs. Exit 1, naming the cause, when a
module cannot be built.
"""

from __future__ import annotations

import sys

from worker import native
from worker.quant import kernels


def main() -> int:
    for name, module in (("cpu ops", native.load()), ("quant ops", kernels.load())):
        if isinstance(module, str):
            print(f"kvledger: the {name} kernels could not be built: {module}", file=sys.stderr)
            return 1
        print(f"kvledger: {name} kernels ready ({module.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
