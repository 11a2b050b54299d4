"""Decode-only steps replayed as CUDA graphs, one graph per batch-size bucket (as vLLM does).

A decode step of a small model is bound by kernel launches, not by the GPU: each layer is a
few dozen small kernels, launched one by one from Python. A CUDA graph records those launches
once and replays them as one. At start the runner captures, for each bucket size B (1, 2, 4, 8,
then multiples of 8 up to `max_batch`), the model's forward over B one-token sequences reading
static input buffers. A step of n decodes takes the smallest bucket B >= n: its inputs go into
the first n rows, the other B - n rows point at a scratch KV block of their own (one block past
the pool the scheduler knows, so a padded row writes and reads nothing of any request's), the
graph replays, and the first n rows of its hidden states are the step's.

Only with the flash_attn backend: everything its decode call varies on per step is a device
tensor (`cache_seqlens`, `block_table`) and every shape stays fixed. The block table is as wide
as `max_model_len` needs, so flash-attn's split-KV count, computed from that width when the
graph is captured, holds for every step replayed. Steps that are not all decodes, or have more
sequences than the largest bucket, run eagerly; so does everything on CPU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from worker.attention.flash_attn_backend import FlashPlan
from worker.runner.batch import BatchLimits, SeqChunk, checked_table

log = logging.getLogger(__name__)


def buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (itself included)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch]
    sizes += list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


@dataclass
class _Inputs:
    """The static buffers every graph reads (bucket B uses the first B rows)."""

    ids: torch.Tensor  # [max_batch] long
    positions: torch.Tensor  # [max_batch] long
    slots: torch.Tensor  # [max_batch] long
    seqlens: torch.Tensor  # [max_batch] int32
    table: torch.Tensor  # [max_batch, width] int32


class DecodeGraphs:
    """Captured decode steps of one model over one KV pool."""

    def __init__(
        self,
        model: nn.Module,
        *,
        max_batch: int,
        block_size: int,
        max_model_len: int,
        scratch_block: int,
        sliding_window: int | None,
        device: torch.device,
    ) -> None:
        self.model = model
        self.sizes = buckets(max_batch)
        self.block_size = block_size
        self.width = -(-max_model_len // block_size)
        self.scratch = scratch_block
        self.window = (sliding_window - 1, 0) if sliding_window is not None else (-1, -1)
        self.device = device
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        with torch.inference_mode():
            self.inputs = self._empty_inputs(max_batch)
            self._pad(0, max_batch)

    def _empty_inputs(self, rows: int) -> _Inputs:
        def z(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=self.device)

        return _Inputs(
            z(rows),
            z(rows),
            z(rows),
            z(rows, dtype=torch.int32),
            z(rows, self.width, dtype=torch.int32),
        )

    def _pad(self, start: int, stop: int) -> None:
        """Rows [start, stop) decode token 0 at position 0 into the scratch block."""
        x = self.inputs
        x.ids[start:stop] = 0
        x.positions[start:stop] = 0
        x.slots[start:stop] = self.scratch * self.block_size
        x.seqlens[start:stop] = 1
        x.table[start:stop] = self.scratch

    def plan(self, batch: int) -> FlashPlan:
        x = self.inputs
        cu = torch.arange(batch + 1, dtype=torch.int32, device=self.device)  # unused by decode
        return FlashPlan(
            slot_mapping=x.slots[:batch],
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            seqlens_k=x.seqlens[:batch],
            max_seqlen_q=1,
            max_seqlen_k=self.width * self.block_size,
            block_table=x.table[:batch],
            window_size=self.window,
            decode_only=True,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest bucket first (as vLLM), all in one memory pool: the smaller graphs reuse
        what the largest took."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        x = self.inputs
        for size in reversed(self.sizes):
            plan = self.plan(size)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up: lazy inits and autotuning stay out
                for _ in range(2):
                    self.model(x.ids[:size], x.positions[:size], plan)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.model(x.ids[:size], x.positions[:size], plan)
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize(self.device)
        log.info(
            "CUDA graphs: decode steps of %s sequences captured in %.1f s",
            ",".join(map(str, self.sizes)),
            time.perf_counter() - started,
        )

    def fits(self, chunks: list[SeqChunk]) -> bool:
        return 0 < len(chunks) <= self.sizes[-1] and all(len(c.token_ids) == 1 for c in chunks)

    def bucket(self, n: int) -> int:
        return next(size for size in self.sizes if size >= n)

    def run(self, chunks: list[SeqChunk], limits: BatchLimits, replay: bool = True) -> torch.Tensor:
        """The hidden states [n, hidden] of n one-token chunks; `replay=False` runs the same
        static inputs eagerly (the check that a replay computes what the model does)."""
        n, size = len(chunks), self.bucket(len(chunks))
        self._load(chunks, limits, size)
        if not replay:
            return self.model(
                self.inputs.ids[:size], self.inputs.positions[:size], self.plan(size)
            )[:n]
        graph, hidden = self.graphs[size]
        graph.replay()
        return hidden[:n]

    def _load(self, chunks: list[SeqChunk], limits: BatchLimits, size: int) -> None:
        """Two host-to-device copies: the long inputs and the int32 ones, padded to `size`."""
        bs = self.block_size
        longs = np.zeros((3, size), dtype=np.int64)
        longs[2] = self.scratch * bs
        ints = np.full((size, 1 + self.width), self.scratch, dtype=np.int32)
        ints[:, 0] = 1
        for i, chunk in enumerate(chunks):
            table = checked_table(chunk, limits)
            pos = chunk.start_pos
            longs[0, i] = chunk.token_ids[0]
            longs[1, i] = pos
            longs[2, i] = table[pos // bs] * bs + pos % bs
            ints[i, 0] = pos + 1
            ints[i, 1 : 1 + len(table)] = table
        x = self.inputs
        staged = torch.from_numpy(longs).to(self.device)
        x.ids[:size].copy_(staged[0])
        x.positions[:size].copy_(staged[1])
        x.slots[:size].copy_(staged[2])
        staged_ints = torch.from_numpy(ints).to(self.device)
        x.seqlens[:size].copy_(staged_ints[:, 0])
        x.table[:size].copy_(staged_ints[:, 1:])
