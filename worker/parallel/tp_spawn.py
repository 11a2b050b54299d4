"""The processes of a tensor-parallel group: rank 0 (the worker `python -m worker` started)
spawns ranks 1..N-1, and the group lives and dies as one.

- Rank 0 opens a TCPStore on a loopback port the kernel picks (no probe-then-bind race) and
  spawns each rank with `multiprocessing`'s spawn start method (a fresh interpreter: no forked
  torch or gRPC threads), handing it the worker's settings, its rank and the port; all join
  one process group (`worker/parallel/distributed.py`) whose collectives time out.
- A rank dies with rank 0: PR_SET_PDEATHSIG (SIGKILL), as `kvledger serve` does for its
  children, and the spawned processes are daemons, terminated at rank 0's normal exit.
- Rank 0 dies with any rank: a thread waits on the ranks' sentinels; a rank that exits before
  rank 0 asked it to takes the whole group down at once (`os._exit`), so the scheduler sees
  one broken stream, one lost worker, and moves its requests. No rank waits for a timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from kvledger.config.worker import WorkerSettings
from kvledger.log import setup_logging
from worker.config import ModelConfig, is_encoder
from worker.executor import Executor
from worker.parallel.distributed import (
    GroupLost,
    TPGroup,
    check_tensor_parallel,
    init_group,
    join_group,
    rank_device,
    start_group,
)
from worker.parallel.tp_group import GroupExecutor, Message, follow
from worker.runner.base import Runner
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def check_group(size: int, model_path: Path) -> None:
    """Refuses, before any process starts, a model or size a group cannot serve."""
    if is_encoder(model_path):
        raise SystemExit(
            f"--tensor-parallel-size {size}: {model_path} is an embedding model, served by a "
            "single-rank worker; drop the flag"
        )
    cfg = ModelConfig.from_dir(model_path)
    try:
        check_tensor_parallel(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, size)
    except ValueError as err:
        raise SystemExit(f"worker: {err}") from None


@dataclass
class RankGroup:
    """Rank 0's handle on its group: the collectives, the other ranks' processes."""

    tp: TPGroup
    procs: list[BaseProcess]
    store: Any  # rank 0 serves the group's store: kept alive as long as the group
    stopping: threading.Event = field(default_factory=threading.Event)
    group_executor: GroupExecutor | None = None

    @classmethod
    def start(cls, settings: WorkerSettings, config: RunnerConfig) -> RankGroup:
        size = settings.tensor_parallel_size
        check_group(size, config.model_path)
        store, port = start_group(size)
        procs = spawn_ranks(settings, config, port)
        group = cls(TPGroup(), procs, store)
        # An exit of rank 0 (a stop while loading: SystemExit) terminates the daemon ranks
        # at exit; registered after multiprocessing's handler, this runs first, so the
        # watcher does not report those ranks as lost.
        atexit.register(group.stopping.set)
        watch_ranks(procs, group.stopping)  # a rank that fails to load ends the wait at once
        group.tp = init_group(store, 0, size, rank_device(settings.device, 0))
        log.info("tensor-parallel group of %d ranks formed", size)
        return group

    def executor(self, runner: Runner) -> GroupExecutor:
        """The executor the link drives; its heartbeat keeps the idle ranks' waits alive."""
        self.group_executor = ex = GroupExecutor(runner, self.tp)

        def beat() -> None:
            try:
                ex.heartbeat()
            except GroupLost as err:
                exit_now(f"the tensor-parallel group is broken ({err}); exiting")

        threading.Thread(target=beat, name="rank-heartbeat", daemon=True).start()
        return ex

    def stop(self) -> None:
        ex = self.group_executor
        stop_ranks(
            self.procs,
            self.stopping,
            ex.stop_group if ex else lambda: self.tp.broadcast(Message("stop")),
        )


def spawn_ranks(settings: WorkerSettings, config: RunnerConfig, port: int) -> list[BaseProcess]:
    """Ranks 1..N-1, started; each joins the group through rank 0's store on `port`."""
    context = multiprocessing.get_context("spawn")
    # the other ranks never talk to the scheduler: they get no secret
    settings = dataclasses.replace(settings, worker_auth_token="")
    procs = []
    for rank in range(1, settings.tensor_parallel_size):
        proc = context.Process(
            target=rank_main,
            args=(settings, config, rank, port, os.getpid()),
            name=f"worker-rank{rank}",
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    return procs


def watch_ranks(procs: list[BaseProcess], stopping: threading.Event) -> threading.Thread:
    """A thread that takes rank 0 down as soon as any other rank exits unasked."""

    def watch() -> None:
        sentinels = {proc.sentinel: proc for proc in procs}
        ready = wait(list(sentinels))
        if stopping.is_set():
            return
        proc = sentinels[ready[0]]  # type: ignore[index]
        proc.join(0.1)
        exit_now(f"{proc.name} exited (code {proc.exitcode}): the tensor-parallel group goes down")

    thread = threading.Thread(target=watch, name="rank-watch", daemon=True)
    thread.start()
    return thread


def exit_now(reason: str, code: int = 1, logger: logging.Logger = log) -> None:
    """Leaves at once, whatever a thread is blocked in (a collective, a gRPC read): the
    sockets close, so the scheduler and the other ranks see this process gone."""
    logger.error("%s", reason)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(code)


def stop_ranks(procs: list[BaseProcess], stopping: threading.Event, send_stop: Callable) -> None:
    """Rank 0's clean exit: the other ranks are told to stop, then waited for (and killed
    when they do not stop within a few seconds)."""
    stopping.set()
    with contextlib.suppress(GroupLost):
        send_stop()
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # rank 0 died before the death signal was armed
        os._exit(1)


def rank_main(
    settings: WorkerSettings,
    config: RunnerConfig,
    rank: int,
    port: int,
    parent: int,
) -> None:
    """Ranks 1..N-1: join the group, load this rank's shard, then run what rank 0 sends."""
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: rank 0 stops the group, not each rank alone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(f"worker-rank{rank}", settings.log_level, settings.log_format)
    try:
        device = rank_device(settings.device, rank)
        tp = join_group(rank, settings.tensor_parallel_size, port, device)
        runner = ModelRunner(config.on(device), tp)
        log.info("rank %d of %d ready", rank, tp.size)
        follow(Executor(runner, defer_compiles=False), tp)  # as rank 0's GroupExecutor
    except GroupLost as err:
        exit_now(f"rank {rank}: the group is broken ({err}); exiting")
    except Exception as err:  # a rank that cannot load takes the group down with it
        log.exception("rank %d failed", rank)
        exit_now(f"rank {rank} failed: {err}")
    log.info("rank %d stopped", rank)
    sys.exit(0)
