"""Turns plans into forward passes: per-request state, provenance checks, step results.

The worker never chooses block ids; it keeps what the plans told it and checks, before reading
a block the plan claims is cached, that the content it wrote there carries the declared hash.
A claimed block may also be one another request of the same plan writes in this step
(same-step sharing, DESIGN section 3): every layer writes all new K/V before any query reads
the cache, so the claim holds if, and only if, that writer really runs.

A bad request (token id outside the vocabulary, too long, NaN logits...) fails alone, with an
error in the step result; the rest of the batch runs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from protos import frontend_pb2, worker_pb2
from worker.batch import BatchLimits, SeqChunk, check_chunk
from worker.pooling import EmbedItem, check_item
from worker.sampler import PromptLogprobs, Sample, TokenLogprobs

log = logging.getLogger(__name__)


class Runner(Protocol):
    """`ModelRunner` / `EmbeddingRunner`. Optional (stand-ins may omit them): `kind`
    ("generate" | "embed"), `limits` (for per-request validation), `embed(items)` and
    `embedding_size`. A stand-in may also return bare token ids from `execute`."""

    def execute(self, chunks: list[SeqChunk]) -> Sequence[Sample | int | None]: ...


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


@dataclass
class StepState:
    """What one plan declares and what became of its requests."""

    # block id -> (hash, request) for blocks written in this step by a request that computes KV
    pending: dict[int, tuple[bytes, str]]
    # request -> requests whose same-step writes it reads
    reads_from: dict[str, set[str]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)  # errored or refused: writes not recorded
    void: set[str] = field(default_factory=set)  # continuations skipped: failed in an earlier plan
    no_kv: set[str] = field(default_factory=set)  # ran, but wrote no KV (embedding passes)


class Executor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.kind: str = getattr(runner, "kind", "generate")
        self.limits: BatchLimits | None = getattr(runner, "limits", None)
        self.embed_fn: Callable[[list[EmbedItem]], list[list[float]]] | None = getattr(
            runner, "embed", None
        )
        self.embedding_size: int = getattr(runner, "embedding_size", 0)
        self.seqs: dict[str, SeqState] = {}
        # Requests this worker failed or refused. Under async scheduling the next plan, made
        # before the scheduler heard of it, may still continue them: those continuations are
        # void and skipped, until a plan drops the request.
        self.voided: set[str] = set()
        # block id -> hash of the content this worker wrote there, as the scheduler declared it
        self.provenance: dict[int, bytes] = {}
        self.counters = StepCounters()

    def reset(self) -> None:
        """After a reconnect: the scheduler starts from an empty cache (all_cleared)."""
        self.seqs.clear()
        self.voided.clear()
        self.provenance.clear()

    def step(self, plan: worker_pb2.Plan) -> worker_pb2.StepResult:
        started = time.perf_counter()
        result = worker_pb2.StepResult(step_id=plan.step_id)
        try:
            self._step(plan, result)
        except Exception as err:  # a poison request must not take the worker down with it
            log.exception("step %d failed; its requests end with an error", plan.step_id)
            result = self.fail_plan(plan, f"the worker failed this step: {err}", result)
        result.step_seconds = time.perf_counter() - started
        return result

    def _step(self, plan: worker_pb2.Plan, result: worker_pb2.StepResult) -> None:
        for request_id in plan.dropped_request_ids:
            self.seqs.pop(request_id, None)
            self.voided.discard(request_id)
        state = StepState(pending=_pending_writes(plan, self.voided))
        scheduled: list[tuple[SeqState, int]] = []
        for new in plan.new_requests:
            seq = self._admit(new, state, result)
            if seq is not None:
                scheduled.append((seq, new.num_scheduled_tokens))
        for cont in plan.continuing:
            if cont.request_id in self.voided:
                state.void.add(cont.request_id)
                continue
            seq = self._continue(cont)
            scheduled.append((seq, cont.num_scheduled_tokens))
        self._run(scheduled, state, result)
        self._record(plan, state, result)

    def fail_plan(
        self,
        plan: worker_pb2.Plan,
        message: str,
        partial: worker_pb2.StepResult | None = None,
    ) -> worker_pb2.StepResult:
        """A step that raised: its requests end with an error, except those it had already
        refused as stale (`partial`; they are recomputed), and the worker keeps serving.

        Only what this step may have written is forgotten: the blocks it declared, and the
        blocks it newly handed to a request. Claimed blocks and blocks filled in earlier steps
        still hold what they held, and the scheduler still caches them: forgetting them here
        would make the next hit on them a false stale entry.
        """
        result = worker_pb2.StepResult(step_id=plan.step_id)
        if partial is not None:
            result.stale_request_ids.extend(partial.stale_request_ids)
            result.removed_block_ids.extend(partial.removed_block_ids)
        for new in plan.new_requests:
            claimed = {c.block_id for c in new.claimed}
            self._forget(b for b in new.block_ids if b not in claimed)
        for cont in plan.continuing:
            self._forget(cont.new_block_ids)
        items = (*plan.new_requests, *plan.continuing)
        self._forget(w.block_id for item in items for w in item.written)
        stale = set(result.stale_request_ids)
        for item in items:
            self.seqs.pop(item.request_id, None)
            self.voided.add(item.request_id)
            if item.request_id not in stale:
                result.errors.add(request_id=item.request_id, message=message)
        return result

    def _admit(
        self, new: worker_pb2.NewRequest, state: StepState, result: worker_pb2.StepResult
    ) -> SeqState | None:
        mismatched: list[int] = []
        writers: set[str] = set()
        for claim in new.claimed:
            declared = state.pending.get(claim.block_id)
            if declared is not None and declared[1] != new.request_id:
                if declared[0] == claim.hash:
                    writers.add(declared[1])  # written earlier in this very step
                else:
                    mismatched.append(claim.block_id)
            elif self.provenance.get(claim.block_id) != claim.hash:
                mismatched.append(claim.block_id)
        if mismatched:
            # A stale entry caught across the process boundary: never read it.
            log.warning(
                "request %s claims blocks %s whose content differs; refusing them",
                new.request_id,
                mismatched,
                extra={"request_id": new.request_id},
            )
            self._refuse(new.request_id, mismatched, state, result)
            return None
        if writers:
            state.reads_from[new.request_id] = writers
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

    def _refuse(
        self, request_id: str, block_ids: list[int], state: StepState, result: worker_pb2.StepResult
    ) -> None:
        """Report the request stale (the scheduler recomputes it) and its blocks removed."""
        for block_id in block_ids:
            self.provenance.pop(block_id, None)
        result.removed_block_ids.extend(block_ids)
        result.stale_request_ids.append(request_id)
        self.counters.stale_block_hits += len(block_ids)
        self.counters.blocks_removed += len(block_ids)
        state.failed.add(request_id)
        self.voided.add(request_id)
        self.seqs.pop(request_id, None)

    def _continue(self, cont: worker_pb2.ContinueRequest) -> SeqState:
        seq = self.seqs[cont.request_id]
        if seq.num_computed_tokens != cont.num_computed_tokens:
            raise RuntimeError(
                f"request {cont.request_id}: worker computed "
                f"{seq.num_computed_tokens} tokens, plan says "
                f"{cont.num_computed_tokens}"
            )
        self._forget(cont.new_block_ids)
        seq.block_table.extend(cont.new_block_ids)
        return seq

    def _forget(self, block_ids: Iterable[int]) -> None:
        """These blocks are about to be overwritten: what was recorded of them is no longer true."""
        for block_id in block_ids:
            self.provenance.pop(block_id, None)

    def _run(
        self, scheduled: list[tuple[SeqState, int]], state: StepState, result: worker_pb2.StepResult
    ) -> None:
        chunks: list[SeqChunk] = []
        items: list[EmbedItem] = []
        for seq, count in scheduled:
            if seq.embed is not None:
                item, error = self._embed_item(seq, count)
                if item is not None:
                    items.append(item)
            else:
                chunk, error = self._chunk(seq, count)
                if chunk is not None:
                    chunks.append(chunk)
            if error is not None:
                self._fail(seq.request_id, error, state, result)
        chunks = self._drop_unwritten_readers(chunks, state, result)
        if chunks:
            self._generate(chunks, state, result)
        if items:
            self._embed(items, state, result)

    def _chunk(self, seq: SeqState, count: int) -> tuple[SeqChunk | None, str | None]:
        if self.kind == "embed":
            return None, "this worker only computes embeddings"
        start = seq.num_computed_tokens
        end = start + count
        if end > len(seq.token_ids):
            return None, (
                f"the plan schedules tokens up to {end}, the request has {len(seq.token_ids)}"
            )
        sp = seq.sampling
        chunk = SeqChunk(
            request_id=seq.request_id,
            token_ids=seq.token_ids[start:end],
            start_pos=start,
            block_table=seq.block_table,
            sample=end == len(seq.token_ids),
            temperature=sp.temperature,
            top_p=sp.top_p or 1.0,
            top_k=sp.top_k,
            min_p=sp.min_p,
            presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty,
            repetition_penalty=sp.repetition_penalty or 1.0,
            seed=sp.seed if sp.HasField("seed") else None,
            logprobs=sp.logprobs,
            prompt_logprobs=sp.prompt_logprobs if sp.HasField("prompt_logprobs") else -1,
            all_token_ids=seq.token_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            logit_bias=dict(sp.logit_bias) or None,
        )
        error = check_chunk(chunk, self.limits) if self.limits is not None else None
        return (None, error) if error else (chunk, None)

    def _embed_item(self, seq: SeqState, count: int) -> tuple[EmbedItem | None, str | None]:
        if self.embed_fn is None or self.limits is None:
            return None, "this worker does not compute embeddings"
        if seq.num_computed_tokens + count != len(seq.token_ids):
            return None, "an embedding request must be scheduled whole, in one step"
        assert seq.embed is not None
        item = EmbedItem(seq.request_id, seq.token_ids, seq.embed.normalize, seq.embed.dimensions)
        error = check_item(
            item, self.limits.vocab_size, self.limits.max_model_len, self.embedding_size
        )
        return (None, error) if error else (item, None)

    def _drop_unwritten_readers(
        self, chunks: list[SeqChunk], state: StepState, result: worker_pb2.StepResult
    ) -> list[SeqChunk]:
        """A request reading blocks that a failed request of this step was to write is refused
        (recomputed later), and so, in turn, is any request reading its writes."""
        while True:
            blocked = [
                c for c in chunks if state.reads_from.get(c.request_id, set()) & state.failed
            ]
            if not blocked:
                return chunks
            for chunk in blocked:
                writers = state.reads_from[chunk.request_id]
                blocks = [
                    b
                    for b, (_, w) in state.pending.items()
                    if w in writers and b in chunk.block_table
                ]
                self._refuse(chunk.request_id, blocks, state, result)
            chunks = [c for c in chunks if c.request_id not in state.failed]

    def _generate(
        self, chunks: list[SeqChunk], state: StepState, result: worker_pb2.StepResult
    ) -> None:
        outputs = self.runner.execute(chunks)
        for chunk, out in zip(chunks, outputs, strict=True):
            sample = Sample(out) if isinstance(out, int) else out
            if sample is not None and sample.error is not None:
                self._fail(chunk.request_id, sample.error, state, result)
                continue
            seq = self.seqs[chunk.request_id]
            seq.num_computed_tokens += len(chunk.token_ids)
            if sample is None:
                continue
            if sample.prompt_logprobs is not None:
                _add_prompt_logprobs(result, seq.request_id, sample.prompt_logprobs)
            if chunk.sample:
                seq.token_ids.append(sample.token_id)
                _add_sampled(result, seq.request_id, sample)

    def _embed(
        self, items: list[EmbedItem], state: StepState, result: worker_pb2.StepResult
    ) -> None:
        assert self.embed_fn is not None
        vectors = self.embed_fn(items)
        for item, vector in zip(items, vectors, strict=True):
            state.no_kv.add(item.request_id)
            if not all(map(math.isfinite, vector)):
                self._fail(
                    item.request_id, "the model produced a NaN or infinite embedding", state, result
                )
                continue
            result.embeddings.add(request_id=item.request_id, values=vector)
            self.seqs.pop(item.request_id, None)  # done in one step

    def _fail(
        self, request_id: str, message: str, state: StepState, result: worker_pb2.StepResult
    ) -> None:
        log.warning("request %s failed: %s", request_id, message, extra={"request_id": request_id})
        result.errors.add(request_id=request_id, message=message)
        state.failed.add(request_id)
        self.voided.add(request_id)
        self.seqs.pop(request_id, None)

    def _record(
        self, plan: worker_pb2.Plan, state: StepState, result: worker_pb2.StepResult
    ) -> None:
        """Provenance of the blocks really written; declared blocks that were not are dropped."""
        written: list[worker_pb2.BlockHash] = []
        for item in (*plan.new_requests, *plan.continuing):
            if item.request_id in state.void:
                continue  # never ran: the scheduler forgets what it declared there itself
            if item.request_id in state.no_kv:
                # The scheduler believes these hold KV an embedding pass never wrote.
                result.removed_block_ids.extend(w.block_id for w in item.written)
                self.counters.blocks_removed += len(item.written)
            elif item.request_id not in state.failed:
                written.extend(item.written)
        # (The scheduler forgets the declared blocks of failed requests itself.)
        for block in written:
            self.provenance[block.block_id] = block.hash
            result.stored.add(block_id=block.block_id, hash=block.hash)
        self.counters.blocks_stored += len(written)


def _pending_writes(plan: worker_pb2.Plan, voided: set[str]) -> dict[int, tuple[bytes, str]]:
    """Blocks this plan declares written, by request; a void continuation writes nothing."""
    pending: dict[int, tuple[bytes, str]] = {}
    for new in plan.new_requests:
        if not new.HasField("embed"):
            pending.update((w.block_id, (w.hash, new.request_id)) for w in new.written)
    for cont in plan.continuing:
        if cont.request_id not in voided:
            pending.update((w.block_id, (w.hash, cont.request_id)) for w in cont.written)
    return pending


def _add_sampled(result: worker_pb2.StepResult, request_id: str, sample: Sample) -> None:
    sampled = result.sampled.add(request_id=request_id, token_id=sample.token_id)
    if sample.logprobs is not None:
        _fill_logprob(sampled.logprob, sample.token_id, sample.logprobs)


def _add_prompt_logprobs(
    result: worker_pb2.StepResult, request_id: str, prompt: PromptLogprobs
) -> None:
    msg = result.prompt_logprobs.add(request_id=request_id, start=prompt.start)
    for token_id, lp in zip(prompt.token_ids, prompt.entries, strict=True):
        _fill_logprob(msg.entries.add(), token_id, lp)


def _fill_logprob(entry: frontend_pb2.TokenLogprob, token_id: int, lp: TokenLogprobs) -> None:
    entry.token_id = token_id
    entry.logprob = lp.logprob
    for top_id, logprob in zip(lp.top_ids, lp.top_logprobs, strict=True):
        entry.top.add(token_id=top_id, logprob=logprob)
