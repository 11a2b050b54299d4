"""One step's input: the sequences' chunks, flattened into a varlen token batch with metadata."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvledger.rpc import MAX_LOGPROBS
from worker.attention.base import AttentionMetadata
from worker.sample.constraints import Constraint
from worker.sample.sampling_params import GREEDY, SamplingParams


@dataclass
class SeqChunk:
    request_id: str
    token_ids: list[int]  # the tokens to compute in this step
    start_pos: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # covers start_pos + len(token_ids) tokens
    sample: bool  # True: return a next token sampled after the last of token_ids
    sampling: SamplingParams = GREEDY  # the request's settings, shared by all its chunks
    # The sequence to date (prompt, then output) and where the prompt ends; read only when a
    # penalty is set or prompt logprobs are asked for. The executor passes its own list: no copy
    # per step.
    all_token_ids: Sequence[int] = ()
    num_prompt_tokens: int = 0
    # The request's grammar matcher (structured outputs), kept by the executor; None: free text.
    constraint: Constraint | None = None
    # Speculative decoding: the last num_drafts of token_ids are drafted, not known; every
    # position from the last known token on is sampled (worker/sample/verify.py).
    num_drafts: int = 0

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)

    @property
    def num_prompt_scored(self) -> int:
        """Prompt tokens whose logprob this chunk yields: those its positions predict, up to the
        last prompt token (the last prompt position predicts the first sampled token)."""
        if self.sampling.prompt_logprobs < 0:
            return 0
        return max(min(self.end_pos, self.num_prompt_tokens - 1) - self.start_pos, 0)


@dataclass(frozen=True)
class BatchLimits:
    block_size: int
    num_blocks: int
    vocab_size: int
    max_model_len: int
    pairs: bool = False  # a cross-encoder: an embedding input may be a text pair (type_start)


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn: AttentionMetadata
    last_rows: list[int]  # flat row of each chunk's last token

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def prepare_batch(
    chunks: list[SeqChunk],
    limits: BatchLimits,
    device: torch.device,
    sliding_window: int | None = None,
) -> StepBatch:
    """Flatten the chunks; a bad chunk raises ValueError naming its request, before any compute."""
    bs = limits.block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    tables: list[list[int]] = []
    last_rows: list[int] = []
    for chunk in chunks:
        table = _check(chunk, limits)
        tables.append(table)
        ids.extend(chunk.token_ids)
        span = range(chunk.start_pos, chunk.end_pos)
        positions.extend(span)
        slots.extend(table[p // bs] * bs + p % bs for p in span)
        last_rows.append(len(ids) - 1)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    query_lens = [len(c.token_ids) for c in chunks]
    cu_q = [0]
    for n in query_lens:
        cu_q.append(cu_q[-1] + n)
    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        query_start_loc=torch.tensor(cu_q, dtype=torch.int32, device=device),
        context_lens=torch.tensor([c.end_pos for c in chunks], dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        query_lens_list=query_lens,
        start_pos_list=[c.start_pos for c in chunks],
        block_tables_list=tables,
        block_size=bs,
        sliding_window=sliding_window,
    )
    return StepBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        attn=attn,
        last_rows=last_rows,
    )


def check_chunk(chunk: SeqChunk, limits: BatchLimits) -> str | None:
    """Why this chunk cannot run, or None; lets the caller fail one request, not the step."""
    try:
        _check(chunk, limits)
    except ValueError as err:
        return str(err)
    return None


def checked_table(chunk: SeqChunk, limits: BatchLimits) -> list[int]:
    """The part of the chunk's block table its context needs; ValueError if the chunk is bad."""
    return _check(chunk, limits)


def _check(chunk: SeqChunk, limits: BatchLimits) -> list[int]:
    """Validate one chunk; return the part of its block table its context needs."""
    who = f"request {chunk.request_id}"
    if not chunk.token_ids:
        raise ValueError(f"{who}: a chunk needs at least one token")
    if chunk.start_pos < 0:
        raise ValueError(f"{who}: negative start_pos {chunk.start_pos}")
    if chunk.end_pos > limits.max_model_len:
        raise ValueError(
            f"{who}: {chunk.end_pos} tokens exceed max_model_len {limits.max_model_len}"
        )
    if min(chunk.token_ids) < 0 or max(chunk.token_ids) >= limits.vocab_size:
        raise ValueError(f"{who}: token id outside the vocabulary [0, {limits.vocab_size})")
    needed = -(-chunk.end_pos // limits.block_size)
    if len(chunk.block_table) < needed:
        raise ValueError(
            f"{who}: block table of {len(chunk.block_table)} blocks cannot hold "
            f"{chunk.end_pos} tokens"
        )
    table = list(chunk.block_table[:needed])
    if min(table) < 0 or max(table) >= limits.num_blocks:
        raise ValueError(f"{who}: block id outside [0, {limits.num_blocks})")
    if chunk.sample:
        _check_sampling(chunk.sampling, who)
    if chunk.sampling.prompt_logprobs > MAX_LOGPROBS:
        raise ValueError(
            f"{who}: at most {MAX_LOGPROBS} prompt logprobs, got {chunk.sampling.prompt_logprobs}"
        )
    if chunk.num_prompt_scored and len(chunk.all_token_ids) < chunk.num_prompt_tokens:
        raise ValueError(f"{who}: prompt logprobs need the whole prompt")
    return table


def _check_sampling(sp: SamplingParams, who: str) -> None:
    if not 0 <= sp.temperature < math.inf:
        raise ValueError(f"{who}: temperature must be >= 0")
    if not 0 < sp.top_p <= 1:
        raise ValueError(f"{who}: top_p must be in (0, 1]")
    if sp.top_k < 0:
        raise ValueError(f"{who}: top_k must be >= 0")
    if not 0 <= sp.min_p <= 1:
        raise ValueError(f"{who}: min_p must be in [0, 1]")
    if not 0 < sp.repetition_penalty < math.inf:
        raise ValueError(f"{who}: repetition_penalty must be > 0")
    if not (math.isfinite(sp.presence_penalty) and math.isfinite(sp.frequency_penalty)):
        raise ValueError(f"{who}: presence and frequency penalties must be finite")
    if sp.logprobs > MAX_LOGPROBS:
        raise ValueError(f"{who}: at most {MAX_LOGPROBS} logprobs, got {sp.logprobs}")


def still_compiling(chunks: list[SeqChunk], other_work: bool) -> set[str]:
    """The requests to leave out of a step: those that would sample while their grammar still
    compiles, when the step runs other work (which would wait for the compile); the scheduler
    plans them again, by when they have usually compiled. When the step holds nothing else,
    none: it runs them and waits for their compiles, since no other request waits then."""
    waiting = {
        c.request_id
        for c in chunks
        if c.sample and c.constraint is not None and not c.constraint.ready()
    }
    return set() if len(waiting) == len(chunks) and not other_work else waiting
