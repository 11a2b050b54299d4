"""The stacks the end-to-end modules share: which `kvledger serve` a module runs against, and
the keeper that runs one stack at a time.

A module that tests a live stack names it with a module-level `STACK = Stack(...)`; the
`served`, `client` and `http` fixtures (tests/e2e/conftest.py) start it and build the clients,
so no module copies them. Consecutive modules naming the same stack (the parts of one subject
split into files) share one running stack, as the tests of one module always have; any other
module stops it first, so at most one shared stack runs at a time, as with module scope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.serving import Served, start_serve


@dataclass(frozen=True)
class Stack:
    """`kvledger serve` with these flags (tiny-llama unless they name a model), with or without
    the embedding worker. Clients send the first `--api-key` among the flags, if any."""

    flags: tuple[str, ...]
    embedding: bool = False

    @property
    def api_key(self) -> str | None:
        flags = list(self.flags)
        return flags[flags.index("--api-key") + 1] if "--api-key" in flags else None


class StackKeeper:
    """Keeps the last stack started, for the next module that names the same one."""

    def __init__(self, make_dir: Callable[[], Path]) -> None:
        self._make_dir = make_dir
        self._running: tuple[Stack, Served] | None = None

    def get(self, stack: Stack) -> Served:
        if self._running is not None and self._running[0] == stack:
            return self._running[1]
        self.stop()
        served = start_serve(self._make_dir(), *stack.flags, embedding=stack.embedding)
        self._running = (stack, served)
        return served

    def keep_only(self, stack: Stack | None) -> None:
        """Stops the running stack unless it is `stack` (called as each module starts)."""
        if self._running is not None and self._running[0] != stack:
            self.stop()

    def stop(self) -> None:
        if self._running is not None:
            _, served = self._running
            self._running = None
            served.stop()


MODEL = "tiny-llama"  # what a stack serves unless its flags name another model
SEP = 102  # tiny-llama's EOS, written by its template after every message

# The stacks that several modules share (one subject split into files). A stack only one module
# runs is written in that module.
SERVE = Stack(("--num-kv-blocks", "64"))
KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"
FRONTEND_API = Stack(
    ("--num-kv-blocks", "128", "--api-key", KEY_A, "--api-key", KEY_B, "--max-n", "4")
)
BOUNDS_KEY = "key-bounds"
# decode steps bundled four at a time
BOUNDS = Stack(("--api-key", BOUNDS_KEY, "--num-scheduler-steps", "4", "--num-kv-blocks", "128"))
