"""Turns plans into forward passes: per-request state from plan deltas, one batch of chunks for
the runner, and the step's outcome.

The worker never chooses block ids; it keeps what the plans told it, and reads a block a plan
claims is cached only once the provenance check (`worker/provenance.py`) vouches for it.

A bad request (token id outside the vocabulary, too long, NaN logits...) fails alone, with an
error in the step's outcome; the rest of the batch runs. Under async scheduling the next plan,
made before the scheduler heard of such a failure, may still continue the request: that
continuation is void, skipped and recording nothing, until a plan drops the request.

Plans and outcomes are the dataclasses of `worker/link/step.py`; `worker/link/wire.py` turns
them into wire messages and back.
"""

from __future__ import annotations

import logging
import math
import time

from kvledger.structured import StructuredError
from worker.link.step import ContinueSeq, EmbedParams, NewSeq, StepOutput, StepPlan
from worker.provenance import PlanWrites, Provenance
from worker.runner.base import Runner
from worker.runner.batch import SeqChunk, check_chunk, still_compiling
from worker.runner.pooling import EmbedItem, check_item
from worker.seq_state import SeqState, StepCounters

log = logging.getLogger(__name__)


class Executor:
    """`defer_compiles` (batch.still_compiling): off in a tensor-parallel group, whose ranks
    must build the same batch and would each see their own compile end at its own moment."""

    def __init__(self, runner: Runner, defer_compiles: bool = True) -> None:
        self.runner = runner
        self.defer_compiles = defer_compiles
        self.seqs: dict[str, SeqState] = {}
        # Requests this worker failed or refused. Under async scheduling the next plan, made
        # before the scheduler heard of it, may still continue them: those continuations are
        # void and skipped, until a plan drops the request.
        self.voided: set[str] = set()
        self.provenance = Provenance()
        self.counters = StepCounters()

    def reset(self) -> None:
        """After a reconnect: the scheduler starts from an empty cache (all_cleared)."""
        self.seqs.clear()
        self.voided.clear()
        self.provenance.clear()

    def step(self, plan: StepPlan) -> StepOutput:
        started = time.perf_counter()
        out = StepOutput(step_id=plan.step_id)
        try:
            self._step(plan, out)
        except Exception as err:  # a poison request must not take the worker down with it
            log.exception("step %d failed; its requests end with an error", plan.step_id)
            out = self.fail_plan(plan, f"the worker failed this step: {err}", out)
        out.step_seconds = time.perf_counter() - started
        return out

    def _step(self, plan: StepPlan, out: StepOutput) -> None:
        for request_id in plan.dropped:
            self.seqs.pop(request_id, None)
            self.voided.discard(request_id)
        writes = PlanWrites.of(plan, self.voided)
        scheduled: list[tuple[SeqState, int]] = []
        for new in plan.new:
            seq = self._admit(new, writes, out)
            if seq is not None:
                scheduled.append((seq, new.num_scheduled_tokens))
        for cont in plan.cont:
            if cont.request_id in self.voided:
                writes.void.add(cont.request_id)
                continue
            scheduled.append((self._continue(cont), cont.num_scheduled_tokens))
        self._run(scheduled, writes, out)
        self._record(plan, writes, out)

    def fail_plan(
        self, plan: StepPlan, message: str, partial: StepOutput | None = None
    ) -> StepOutput:
        """A step that raised: its requests end with an error, except those it had already
        refused as stale or deferred (`partial`; they are planned again), and the worker
        keeps serving.

        Only what this step may have written is forgotten: the blocks it declared, and the
        blocks it newly handed to a request. Claimed blocks and blocks filled in earlier steps
        still hold what they held, and the scheduler still caches them: forgetting them here
        would make the next hit on them a false stale entry.
        """
        out = StepOutput(step_id=plan.step_id)
        if partial is not None:
            out.stale_request_ids.extend(partial.stale_request_ids)
            out.deferred_request_ids.extend(partial.deferred_request_ids)
            out.removed_block_ids.extend(partial.removed_block_ids)
        for new in plan.new:
            claimed = {b for b, _ in new.claimed}
            self.provenance.forget(b for b in new.block_ids if b not in claimed)
        for cont in plan.cont:
            self.provenance.forget(cont.new_block_ids)
        items = plan.items()
        self.provenance.forget(b for item in items for b, _ in item.written)
        stale = set(out.stale_request_ids) | set(out.deferred_request_ids)
        for item in items:
            self.seqs.pop(item.request_id, None)
            self.voided.add(item.request_id)
            if item.request_id not in stale:
                out.errors.append((item.request_id, message))
        return out

    def _admit(self, new: NewSeq, writes: PlanWrites, out: StepOutput) -> SeqState | None:
        mismatched = self.provenance.verify(new.request_id, new.claimed, writes)
        if mismatched:
            # A stale entry caught across the process boundary: never read it.
            log.warning(
                "request %s claims blocks %s whose content differs; refusing them",
                new.request_id,
                mismatched,
                extra={"request_id": new.request_id},
            )
            self._refuse(new.request_id, mismatched, writes, out)
            return None
        claimed = {b for b, _ in new.claimed}
        self.provenance.forget(b for b in new.block_ids if b not in claimed)
        seq = SeqState(
            request_id=new.request_id,
            token_ids=list(new.token_ids),
            block_table=list(new.block_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            num_computed_tokens=new.num_computed_tokens,
            sampling=new.sampling,
            embed=new.embed,
        )
        self.seqs[seq.request_id] = seq
        return seq

    def _refuse(
        self, request_id: str, block_ids: list[int], writes: PlanWrites, out: StepOutput
    ) -> None:
        """Report the request stale (the scheduler recomputes it) and its blocks removed."""
        self.provenance.forget(block_ids)
        out.removed_block_ids.extend(block_ids)
        out.stale_request_ids.append(request_id)
        self.counters.stale_block_hits += len(block_ids)
        self.counters.blocks_removed += len(block_ids)
        writes.failed.add(request_id)
        self.voided.add(request_id)
        self.seqs.pop(request_id, None)

    def _continue(self, cont: ContinueSeq) -> SeqState:
        seq = self.seqs[cont.request_id]
        if seq.num_computed_tokens != cont.num_computed_tokens:
            raise RuntimeError(
                f"request {cont.request_id}: worker computed "
                f"{seq.num_computed_tokens} tokens, plan says "
                f"{cont.num_computed_tokens}"
            )
        self.provenance.forget(cont.new_block_ids)
        seq.block_table.extend(cont.new_block_ids)
        seq.drafts = cont.draft_token_ids
        return seq

    def _run(
        self, scheduled: list[tuple[SeqState, int]], writes: PlanWrites, out: StepOutput
    ) -> None:
        chunks: list[SeqChunk] = []
        items: list[EmbedItem] = []
        for seq, count in scheduled:
            if seq.embed is not None:
                item, error = self._embed_item(seq, seq.embed, count)
                if item is not None:
                    items.append(item)
            else:
                chunk, error = self._chunk(seq, count)
                if chunk is not None:
                    chunks.append(chunk)
            if error is not None:
                self._fail(seq.request_id, error, writes, out)
        chunks = self._defer_compiling(chunks, bool(items), writes, out)
        # A request reading blocks that a failed request of this step was to write is refused.
        unwritten = writes.unwritten_reads({c.request_id: c.block_table for c in chunks})
        for request_id, block_ids in unwritten.items():
            self._refuse(request_id, block_ids, writes, out)
        chunks = [c for c in chunks if c.request_id not in writes.failed]
        if chunks:
            self._generate(chunks, writes, out)
        if items:
            self._embed(items, writes, out)

    def _defer_compiling(
        self, chunks: list[SeqChunk], other_work: bool, writes: PlanWrites, out: StepOutput
    ) -> list[SeqChunk]:
        """Chunks `still_compiling` says to leave out of this step: reported deferred (the
        scheduler plans them again), nothing they were to write declared written."""
        waiting = still_compiling(chunks, other_work) if self.defer_compiles else set()
        for request_id in waiting:
            out.deferred_request_ids.append(request_id)
            writes.failed.add(request_id)
            self.voided.add(request_id)
            self.seqs.pop(request_id, None)
        return [c for c in chunks if c.request_id not in waiting]

    def _chunk(self, seq: SeqState, count: int) -> tuple[SeqChunk | None, str | None]:
        if self.runner.kind == "embed":
            return None, "this worker only computes embeddings"
        start = seq.num_computed_tokens
        end = start + count
        tokens = seq.token_ids + seq.drafts if seq.drafts else seq.token_ids
        if end > len(tokens) or (seq.drafts and end != len(tokens)):
            return None, (
                f"the plan schedules tokens up to {end}, the request has {len(seq.token_ids)}"
                f" and {len(seq.drafts)} drafted"
            )
        spec = seq.sampling.structured
        if spec is not None and seq.constraint is None:
            try:
                seq.constraint = self.runner.constraint(spec)
            except StructuredError as err:
                return None, str(err)
        chunk = SeqChunk(
            request_id=seq.request_id,
            token_ids=tokens[start:end],
            start_pos=start,
            block_table=seq.block_table,
            sample=end == len(tokens),
            sampling=seq.sampling,
            all_token_ids=seq.token_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            constraint=seq.constraint,
            num_drafts=len(seq.drafts),
        )
        error = check_chunk(chunk, self.runner.limits)
        return (None, error) if error else (chunk, None)

    def _embed_item(
        self, seq: SeqState, embed: EmbedParams, count: int
    ) -> tuple[EmbedItem | None, str | None]:
        size = self.runner.embedding_size
        if not size:
            return None, "this worker does not compute embeddings"
        if seq.num_computed_tokens + count != len(seq.token_ids):
            return None, "an embedding request must be scheduled whole, in one step"
        item = EmbedItem(
            seq.request_id, seq.token_ids, embed.normalize, embed.dimensions, embed.type_start
        )
        limits = self.runner.limits
        error = check_item(item, limits.vocab_size, limits.max_model_len, size, limits.pairs)
        return (None, error) if error else (item, None)

    def _generate(self, chunks: list[SeqChunk], writes: PlanWrites, out: StepOutput) -> None:
        outputs = self.runner.execute(chunks)
        for chunk, sample in zip(chunks, outputs, strict=True):
            if sample is not None and sample.error is not None:
                self._fail(chunk.request_id, sample.error, writes, out)
                continue
            seq = self.seqs[chunk.request_id]
            seq.num_computed_tokens += len(chunk.token_ids) - chunk.num_drafts
            if sample is None:
                continue
            if sample.prompt_logprobs is not None:
                out.prompt_logprobs.append((seq.request_id, sample.prompt_logprobs))
            if chunk.sample:
                if chunk.num_drafts:
                    self._keep_drafts(seq, sample.accepted_ids)
                seq.token_ids.append(sample.token_id)
                out.sampled.append((seq.request_id, sample))

    def _keep_drafts(self, seq: SeqState, kept: list[int]) -> None:
        """The drafts kept are tokens now, their positions computed; the blocks only rejected
        drafts reached leave the table, as the scheduler trims its own (the same rule: the
        blocks that hold the computed tokens)."""
        seq.drafts = []
        seq.token_ids.extend(kept)
        seq.num_computed_tokens += len(kept)
        size = self.runner.limits.block_size
        needed = -(-seq.num_computed_tokens // size)
        del seq.block_table[needed:]

    def _embed(self, items: list[EmbedItem], writes: PlanWrites, out: StepOutput) -> None:
        vectors = self.runner.embed(items)
        for item, vector in zip(items, vectors, strict=True):
            writes.no_kv.add(item.request_id)
            if not all(map(math.isfinite, vector)):
                self._fail(
                    item.request_id, "the model produced a NaN or infinite embedding", writes, out
                )
                continue
            out.embeddings.append((item.request_id, vector))
            self.seqs.pop(item.request_id, None)  # done in one step

    def _fail(self, request_id: str, message: str, writes: PlanWrites, out: StepOutput) -> None:
        log.warning("request %s failed: %s", request_id, message, extra={"request_id": request_id})
        out.errors.append((request_id, message))
        writes.failed.add(request_id)
        self.voided.add(request_id)
        self.seqs.pop(request_id, None)

    def _record(self, plan: StepPlan, writes: PlanWrites, out: StepOutput) -> None:
        """Provenance of the blocks really written, recorded now that the plan ran; blocks an
        embedding pass was declared to fill are reported removed."""
        written, unwritten = writes.settle(plan)
        out.removed_block_ids.extend(unwritten)
        self.counters.blocks_removed += len(unwritten)
        self.provenance.record(written)
        out.stored.extend(written)
        self.counters.blocks_stored += len(written)
