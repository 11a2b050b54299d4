"""Structured-output specs compiled out of the frontend's process, each within a deadline.

Why: the frontend compiles every constraint before it accepts the request (a spec the engine
refuses is a 400, not a failure on the worker). The engine is native code: a spec that crashes
it, or keeps it busy for seconds, would take down or stall the process that streams every other
request. So the compile runs in child processes (server/grammar_child.py): a child that dies
refuses that request with a 400 and is replaced; a compile past `--structured-compile-timeout`
kills its child, and the request gets a 400 naming the limit. The frontend's own threads only
wait on a pipe.

Each child builds the engine's tokenizer of a model once (from the model's tokenizer JSON) and
keeps it; a model whose tokenizer the engine refuses is refused once per process, as before.
At most CHILDREN compile at once; more requests wait for one (their deadline starts when their
compile does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvledger.groups import GrammarLimits
from kvledger.structured import StructuredError, StructuredSpec, what_kind
from server.grammar_child import write_message

log = logging.getLogger(__name__)

CHILDREN = 2
POLL_SECONDS = 0.02  # how often a waiting check reads its child's CPU time
WALL_FACTOR, MIN_WALL = 10.0, 30.0  # the wall-clock backstop of a check
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Building a tokenizer for the engine is not the spec's cost (about a second for a 49k vocabulary).
TOKENIZER_TIMEOUT = 120.0


@dataclass(frozen=True)
class GrammarModel:
    """What a child needs to compile against a model: its tokenizer, as the engine reads it."""

    key: str
    tokenizer_json: str = field(repr=False)
    vocab_size: int
    eos_token_ids: tuple[int, ...]


class _Budget:
    """What one request to a child may spend: CPU seconds, read from /proc (wall time where
    /proc cannot be read), and a wall-clock backstop."""

    def __init__(self, pid: int, cpu_seconds: float) -> None:
        self.pid, self.cpu_seconds = pid, cpu_seconds
        self.wall_deadline = time.monotonic() + max(MIN_WALL, WALL_FACTOR * cpu_seconds)
        self.started = time.monotonic()
        self.cpu_at_start = self._cpu()

    def _cpu(self) -> float | None:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def spent(self) -> bool:
        now = time.monotonic()
        if now >= self.wall_deadline:
            return True
        cpu = self._cpu()
        if cpu is None or self.cpu_at_start is None:
            return now - self.started >= self.cpu_seconds
        return cpu - self.cpu_at_start >= self.cpu_seconds


class _Died(Exception):
    """The child ended (or was killed) before it answered."""


class _Child:
    """One child process and the tokenizers it has built (or refused)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.grammar_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.tokenizers: dict[str, str | None] = {}  # key -> None (built) or why it was refused

    def ask(self, message: dict[str, Any], cpu_seconds: float) -> dict[str, Any]:
        """The child's answer within `cpu_seconds` of its CPU time (and WALL_FACTOR times that
        of wall time, at least MIN_WALL); TimeoutError (the child is killed) or _Died
        otherwise. CPU time, not wall time: the child runs at a low priority, so on a busy
        machine its wall time says how loaded the machine is, not what the spec costs."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            write_message(self.proc.stdin, message)  # type: ignore[arg-type]
        except OSError:
            raise _Died from None
        budget = _Budget(self.proc.pid, cpu_seconds)
        head = self._read(4, budget)
        (size,) = struct.unpack(">I", head)
        return json.loads(self._read(size, budget))

    def _read(self, size: int, budget: _Budget) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        data = b""
        while len(data) < size:
            while not select.select([fd], [], [], POLL_SECONDS)[0]:
                if budget.spent():
                    self.kill()
                    raise TimeoutError
            chunk = os.read(fd, size - len(data))  # the pipe itself: nothing buffered here
            if not chunk:
                raise _Died
            data += chunk
        return data

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def exit_reason(self) -> str:
        self.proc.wait()
        code = self.proc.returncode
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"


class GrammarSandbox:
    """Checks specs in child processes (started on first use, replaced when they die)."""

    def __init__(self, children: int = CHILDREN) -> None:
        self._idle: queue.Queue[_Child | None] = queue.Queue()
        for _ in range(children):
            self._idle.put(None)  # a slot: a child is started when a check takes it
        self.crashes = 0
        self.timeouts = 0

    def check(
        self, spec: StructuredSpec, model: GrammarModel, limits: GrammarLimits, timeout: float
    ) -> None:
        """StructuredError naming the problem when `spec` does not compile against `model`'s
        tokenizer under `limits`, crashes the compiler, or takes longer than `timeout`."""
        child = self._idle.get()
        try:
            if child is None or not child.alive():
                child = _Child()
            self._tokenizer(child, model)
            message = {
                "op": "check",
                "key": model.key,
                "kind": spec.kind,
                "spec": spec.spec,
                "limits": {
                    f.name: getattr(limits, f.name) for f in dataclasses.fields(GrammarLimits)
                },
            }
            try:
                answer = child.ask(message, timeout)
            except TimeoutError:
                self.timeouts += 1
                child = None
                raise StructuredError(
                    f"{what_kind(spec.kind)} takes more than {timeout:g} s of CPU to compile "
                    "(--structured-compile-timeout)"
                ) from None
            except _Died:
                self.crashes += 1
                reason = child.exit_reason()
                log.warning(
                    "the grammar compiler died on a request's %s (%s); a new one starts",
                    spec.kind,
                    reason,
                )
                child = None
                raise StructuredError(
                    f"{what_kind(spec.kind)} cannot be compiled: the grammar engine failed on "
                    f"it ({reason})"
                ) from None
            if "error" in answer:
                raise StructuredError(answer["error"])
        finally:
            self._idle.put(child)

    def _tokenizer(self, child: _Child, model: GrammarModel) -> None:
        """The model's tokenizer built in `child` (once), or StructuredError saying why the
        engine refuses it."""
        if model.key not in child.tokenizers:
            message = {
                "op": "tokenizer",
                "key": model.key,
                "json": model.tokenizer_json,
                "vocab_size": model.vocab_size,
                "eos": list(model.eos_token_ids),
            }
            try:
                answer = child.ask(message, TOKENIZER_TIMEOUT)
            except (TimeoutError, _Died):
                raise StructuredError(
                    "structured outputs are not available: the grammar engine could not load "
                    "the model's tokenizer"
                ) from None
            child.tokenizers[model.key] = answer.get("error")
        refused = child.tokenizers[model.key]
        if refused is not None:
            raise StructuredError(refused)

    def close(self) -> None:
        while not self._idle.empty():
            child = self._idle.get_nowait()
            if child is not None:
                child.kill()


_sandbox: GrammarSandbox | None = None
_sandbox_lock = threading.Lock()


def close_sandbox() -> None:
    """Stops the process's sandbox children, if it started any."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is not None:
            _sandbox.close()
            _sandbox = None


def sandbox() -> GrammarSandbox:
    """The frontend process's sandbox (one per process: its children are its own)."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = GrammarSandbox()
        return _sandbox
