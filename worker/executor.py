"""Turns plans into forward passes: per-request state, provenance checks, step results.

The worker never chooses block ids; it keeps what the plans told it and checks, before reading
a block the plan claims is cached, that the content it wrote there carries the declared hash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from protos import frontend_pb2, worker_pb2
from worker.batch import SeqChunk

log = logging.getLogger(__name__)


class Runner(Protocol):
    def execute(self, chunks: list[SeqChunk]) -> list[int | None]: ...


@dataclass
class SeqState:
    request_id: str
    token_ids: list[int]
    block_table: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    sampling: frontend_pb2.SamplingParams
    embed: worker_pb2.EmbedParams | None


@dataclass
class StepCounters:
    stale_block_hits: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0


class Executor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.seqs: dict[str, SeqState] = {}
        # block id -> hash of the content this worker wrote there, as the scheduler declared it
        self.provenance: dict[int, bytes] = {}
        self.counters = StepCounters()

    def reset(self) -> None:
        """After a reconnect: the scheduler starts from an empty cache (all_cleared)."""
        self.seqs.clear()
        self.provenance.clear()

    def step(self, plan: worker_pb2.Plan) -> worker_pb2.StepResult:
        started = time.perf_counter()
        result = worker_pb2.StepResult(step_id=plan.step_id)
        for request_id in plan.dropped_request_ids:
            self.seqs.pop(request_id, None)
        scheduled: list[tuple[SeqState, int]] = []
        for new in plan.new_requests:
            seq = self._admit(new, result)
            if seq is not None:
                scheduled.append((seq, new.num_scheduled_tokens))
        for cont in plan.continuing:
            seq = self._continue(cont)
            scheduled.append((seq, cont.num_scheduled_tokens))
        self._run(scheduled, result)
        written = [w for new in plan.new_requests if new.request_id not in
                   result.stale_request_ids for w in new.written]
        written += [w for cont in plan.continuing for w in cont.written]
        self._record(written, result)
        result.step_seconds = time.perf_counter() - started
        return result

    def _admit(self, new: worker_pb2.NewRequest,
               result: worker_pb2.StepResult) -> SeqState | None:
        mismatched = [c.block_id for c in new.claimed
                      if self.provenance.get(c.block_id) != c.hash]
        if mismatched:
            # A stale entry caught across the process boundary: never read it.
            log.warning("request %s claims blocks %s whose content differs; refusing them",
                        new.request_id, mismatched)
            for block_id in mismatched:
                self.provenance.pop(block_id, None)
            result.removed_block_ids.extend(mismatched)
            result.stale_request_ids.append(new.request_id)
            self.counters.stale_block_hits += len(mismatched)
            self.counters.blocks_removed += len(mismatched)
            return None
        claimed = {c.block_id for c in new.claimed}
        self._forget(b for b in new.block_ids if b not in claimed)
        seq = SeqState(
            request_id=new.request_id,
            token_ids=list(new.token_ids),
            block_table=list(new.block_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            num_computed_tokens=new.num_computed_tokens,
            sampling=new.sampling,
            embed=new.embed if new.HasField("embed") else None,
        )
        self.seqs[seq.request_id] = seq
        return seq

    def _continue(self, cont: worker_pb2.ContinueRequest) -> SeqState:
        seq = self.seqs[cont.request_id]
        if seq.num_computed_tokens != cont.num_computed_tokens:
            raise RuntimeError(f"request {cont.request_id}: worker computed "
                               f"{seq.num_computed_tokens} tokens, plan says "
                               f"{cont.num_computed_tokens}")
        self._forget(cont.new_block_ids)
        seq.block_table.extend(cont.new_block_ids)
        return seq

    def _forget(self, block_ids: Iterable[int]) -> None:
        """These blocks are about to be overwritten: what was recorded of them is no longer true."""
        for block_id in block_ids:
            self.provenance.pop(block_id, None)

    def _run(self, scheduled: list[tuple[SeqState, int]], result: worker_pb2.StepResult) -> None:
        chunks: list[SeqChunk] = []
        for seq, count in scheduled:
            start = seq.num_computed_tokens
            end = start + count
            if seq.embed is not None:
                result.errors.add(request_id=seq.request_id,
                                  message="this worker does not compute embeddings")
                continue
            sp = seq.sampling
            chunks.append(SeqChunk(
                request_id=seq.request_id,
                token_ids=seq.token_ids[start:end],
                start_pos=start,
                block_table=seq.block_table,
                sample=end == len(seq.token_ids),
                temperature=sp.temperature,
                top_p=sp.top_p or 1.0,
                top_k=sp.top_k,
                seed=sp.seed if sp.HasField("seed") else None,
            ))
        if not chunks:
            return
        tokens = self.runner.execute(chunks)
        for chunk, token in zip(chunks, tokens, strict=True):
            seq = self.seqs[chunk.request_id]
            seq.num_computed_tokens += len(chunk.token_ids)
            if token is not None:
                seq.token_ids.append(token)
                result.sampled.add(request_id=seq.request_id, token_id=token)

    def _record(self, written: list[worker_pb2.BlockHash], result: worker_pb2.StepResult) -> None:
        for block in written:
            self.provenance[block.block_id] = block.hash
            result.stored.add(block_id=block.block_id, hash=block.hash)
        self.counters.blocks_stored += len(written)
