"""How a tensor-parallel group runs plans: every rank runs the same executor on the same plan.

Rank 0 owns the link to the scheduler. Each plan it pulls is decoded there (`worker/link/wire.py`)
into the plain dataclasses of `worker/link/step.py` and broadcast, pickled, to the other ranks
(`torch.distributed.broadcast_object_list` on the group's control channel); then every rank
runs `Executor.step` on it. Why every rank runs the whole executor rather than rank 0 alone
with the others following a chunk list: the executor's outcome is a pure function of the plan,
the executor's state and the logits, and every rank has the same plans, the same block ids and
(after the all-gather of the LM head) the same logits, so every rank's executor reaches the same
state: the same provenance records and refusals, the same per-request errors, the same sampled
tokens from the same per-position seeds. The provenance check is then not a rank 0 special
case, a refused or failed request skips the forward pass on every rank alike (their
collectives stay matched), and only rank 0's `StepOutput` goes back to the scheduler.

Between steps rank 0 sends a heartbeat every HEARTBEAT_SECONDS, so the other ranks wait for the
next plan under a collective timeout without an idle group ever timing out.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from worker.executor import Executor
from worker.link.step import StepOutput, StepPlan
from worker.parallel.distributed import HEARTBEAT_SECONDS, GroupLost, TPGroup
from worker.runner.base import Runner

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Message:
    """What rank 0 tells the other ranks: "plan" (run it), "reset" (the link reconnected: an
    empty cache, as `Executor.reset`), "idle" (a heartbeat) or "stop"."""

    kind: str
    plan: StepPlan | None = None


class GroupExecutor(Executor):
    """Rank 0's executor: each step and reset is first sent to the other ranks, then run here.
    The link (`worker/link/client.py`) uses it as it uses a single-process executor."""

    def __init__(self, runner: Runner, tp: TPGroup) -> None:
        super().__init__(runner, defer_compiles=False)  # every rank must build the same batch
        self.tp = tp
        self._lock = threading.Lock()  # one sender at a time on the control channel
        self._last_sent = time.monotonic()
        self._stopped = threading.Event()

    def send(self, message: Message) -> None:
        with self._lock:
            self.tp.broadcast(message)
            self._last_sent = time.monotonic()

    def step(self, plan: StepPlan) -> StepOutput:
        self.send(Message("plan", plan))
        return super().step(plan)

    def reset(self) -> None:
        self.send(Message("reset"))
        super().reset()

    def stop_group(self) -> None:
        """Tells the other ranks to exit; the heartbeat stops."""
        self._stopped.set()
        self.send(Message("stop"))

    def heartbeat(self) -> None:
        """Runs in its own thread: an "idle" message whenever nothing was sent for
        HEARTBEAT_SECONDS. The other ranks take it once they are done with their step."""
        while not self._stopped.wait(HEARTBEAT_SECONDS / 2):
            with self._lock:
                if self._stopped.is_set():
                    return
                if time.monotonic() - self._last_sent >= HEARTBEAT_SECONDS:
                    self.tp.broadcast(Message("idle"))
                    self._last_sent = time.monotonic()


def follow(executor: Executor, tp: TPGroup) -> None:
    """A rank other than 0: run what rank 0 sends until it says stop. A broken group raises
    GroupLost (the caller exits)."""
    while True:
        message: Message = tp.broadcast()
        if message.kind == "plan":
            assert message.plan is not None
            executor.step(message.plan)
        elif message.kind == "reset":
            executor.reset()
        elif message.kind == "stop":
            return
        elif message.kind != "idle":
            raise GroupLost(f"unknown message from rank 0: {message.kind!r}")
