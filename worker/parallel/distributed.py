"""A tensor-parallel group as the model sees it: its rank, its size, the collectives a sharded
forward pass needs, and how a model's heads and vocabulary divide among the ranks.

Collectives run on `torch.distributed` (gloo on CPU, NCCL on CUDA), never on a home-made
transport. Two process groups over the same ranks keep two conversations apart: `control`
carries rank 0's messages (plans, resets, heartbeats: `worker/parallel/tp_group.py`) and
`compute` the forward pass's all-reduces and all-gathers, so a heartbeat sent while a step
computes can never be taken for one of the step's collectives.

A failed collective (a dead peer, a timeout) raises `GroupLost`, a BaseException: the
executor turns an Exception into a failed step and keeps serving, which would leave this rank
one collective behind the others forever. A group that lost a rank serves nothing more; the
process exits and the scheduler sees one lost worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# How long a collective waits for the slowest rank. Inside a step the ranks meet at every
# layer, so this bounds a rank's lead over a slower one, not a step's length; between steps,
# rank 0 sends a heartbeat every HEARTBEAT_SECONDS, so an idle group never times out.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
HEARTBEAT_SECONDS = 5.0


class GroupLost(BaseException):
    """A collective failed: a rank died or stopped answering. Fatal for the whole group."""


@dataclass(frozen=True)
class HeadSplit:
    """One rank's attention heads: a contiguous range of query heads and the KV heads they
    read. With fewer KV heads than ranks, each KV head is replicated on size // kv ranks."""

    q_start: int
    q_heads: int
    kv_start: int
    kv_heads: int


def split_heads(num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadSplit:
    """Megatron's split of the query heads, and vLLM's of the KV heads (divided when there are
    at least as many as ranks, else replicated), refused with a message when it is not even."""
    check_heads(num_heads, num_kv_heads, size)
    q_heads = num_heads // size
    if num_kv_heads >= size:
        kv_heads = num_kv_heads // size
        return HeadSplit(rank * q_heads, q_heads, rank * kv_heads, kv_heads)
    # rank r's query heads all belong to KV head r * kv // size (kv divides size)
    return HeadSplit(rank * q_heads, q_heads, rank * num_kv_heads // size, 1)


def check_heads(num_heads: int, num_kv_heads: int, size: int) -> None:
    if size < 1:
        raise ValueError(f"--tensor-parallel-size must be at least 1, got {size}")
    if num_heads % size:
        raise ValueError(
            f"--tensor-parallel-size {size} does not divide the model's {num_heads} attention "
            f"heads; use a size that does ({_divisors(num_heads)})"
        )
    if num_kv_heads >= size and num_kv_heads % size:
        raise ValueError(
            f"--tensor-parallel-size {size} does not divide the model's {num_kv_heads} KV "
            f"heads; use a size that does ({_divisors(num_kv_heads)}), or a multiple of "
            f"{num_kv_heads} dividing {num_heads} (KV heads are then replicated)"
        )
    if num_kv_heads < size and size % num_kv_heads:
        raise ValueError(
            f"--tensor-parallel-size {size} is not a multiple of the model's {num_kv_heads} KV "
            "heads: with fewer KV heads than ranks each KV head is replicated on an equal "
            "number of ranks"
        )


def check_tensor_parallel(
    num_heads: int, num_kv_heads: int, intermediate_size: int, size: int
) -> None:
    """Everything a size must divide, checked before any process or memory is taken."""
    check_heads(num_heads, num_kv_heads, size)
    if intermediate_size % size:
        raise ValueError(
            f"--tensor-parallel-size {size} does not divide the model's MLP width "
            f"{intermediate_size}"
        )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class VocabShard:
    """Rows [start, stop) of the vocabulary; every rank holds `per_rank` rows (the last one
    padded with zero rows) so that the all-gather of logits is of equal pieces."""

    start: int
    stop: int
    per_rank: int

    @classmethod
    def of(cls, vocab_size: int, rank: int, size: int) -> VocabShard:
        per = math.ceil(vocab_size / size)
        start = min(rank * per, vocab_size)
        return cls(start, min(start + per, vocab_size), per)


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel group. `size` 1 is no group at all."""

    rank: int = 0
    size: int = 1
    compute: Any = None  # dist.ProcessGroup for the forward pass
    control: Any = None  # dist.ProcessGroup for rank 0's messages

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place. gloo and NCCL reduce each element once and copy the
        result, so every rank holds the same bits (its sampling follows from them)."""
        try:
            dist.all_reduce(t, group=self.compute)
        except Exception as err:
            raise GroupLost(f"all_reduce failed: {err}") from err
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n], rank order."""
        pieces = [torch.empty_like(t) for _ in range(self.size)]
        try:
            dist.all_gather(pieces, t.contiguous(), group=self.compute)
        except Exception as err:
            raise GroupLost(f"all_gather failed: {err}") from err
        return torch.cat(pieces, dim=-1)

    def min_int(self, value: int) -> int:
        """The smallest of each rank's value (the KV pool every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        except Exception as err:
            raise GroupLost(f"all_reduce failed: {err}") from err
        return int(t.item())

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's `message` (pickled), returned on every rank."""
        box = [message]
        try:
            dist.broadcast_object_list(box, src=0, group=self.control)
        except Exception as err:
            raise GroupLost(f"broadcast failed: {err}") from err
        return box[0]


def rank_device(device: str, rank: int) -> str:
    """Each rank of a CUDA group takes its own GPU: `--device cuda:i` gives rank r GPU i + r.
    A CPU group shares the CPU (each rank a share of its cores)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return device
    return f"cuda:{(dev.index or 0) + rank}"


def join_group(rank: int, size: int, port: int, device: str) -> TPGroup:
    """Joins the group whose store rank 0 serves on 127.0.0.1:`port` (a loopback TCPStore: the
    group never leaves the machine). Every collective times out after COLLECTIVE_TIMEOUT."""
    store = dist.TCPStore(
        "127.0.0.1", port, size, is_master=False, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False
    )
    return init_group(store, rank, size, device)


def start_group(size: int) -> tuple[dist.TCPStore, int]:
    """Rank 0's store on a free loopback port, chosen by the kernel (no probe-then-bind race)."""
    store = dist.TCPStore(
        "127.0.0.1", 0, size, is_master=True, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False
    )
    return store, store.port


def init_group(store: dist.Store, rank: int, size: int, device: str) -> TPGroup:
    """This process's place in the group: the default process group (the forward pass's
    collectives) and a second, gloo one for rank 0's messages."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # never run: no GPU where this was built
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT
    )
    # Control messages are pickled objects: gloo carries them on CPU whatever the device.
    control = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return TPGroup(rank, size, dist.group.WORLD, control)
