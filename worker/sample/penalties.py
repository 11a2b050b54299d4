"""Repetition, frequency and presence penalties, per request, on a batch of logits.

- repetition (Hugging Face / CTRL semantics): every token seen in the prompt or the output so
  far has its logit divided by the penalty when positive, multiplied when negative;
- frequency and presence (OpenAI semantics), over output tokens only:
  logit -= frequency * count + presence * (count > 0).

The prompt/output split comes from the chunk (`num_prompt_tokens`), which the executor keeps
across preemption, so a recomputed request is penalized exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from worker.runner.batch import SeqChunk


def apply_penalties(logits: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
    """logits [N, V] float32, one row per chunk -> a penalized copy (or `logits` itself)."""
    rows = [i for i, c in enumerate(chunks) if c.sampling.has_penalties]
    if not rows:
        return logits
    picked = [chunks[i] for i in rows]
    num_rows, vocab = len(rows), logits.shape[1]
    device = logits.device
    prompt = _padded([c.all_token_ids[: c.num_prompt_tokens] for c in picked], vocab, device)
    output = _padded(
        [c.all_token_ids[c.num_prompt_tokens : c.end_pos] for c in picked], vocab, device
    )
    # Column `vocab` collects the padding and is cut off.
    counts = torch.zeros(num_rows, vocab + 1, device=device)
    counts.scatter_add_(1, output, torch.ones_like(output, dtype=counts.dtype))
    counts = counts[:, :vocab]
    in_output = counts > 0
    seen = torch.zeros(num_rows, vocab + 1, dtype=torch.bool, device=device)
    seen.scatter_(1, prompt, True)
    seen = seen[:, :vocab] | in_output

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor([float(v) for v in values], device=device).unsqueeze(1)

    params = [c.sampling for c in picked]
    sub = logits[rows]
    repetition = column([p.repetition_penalty for p in params])
    penalized = torch.where(sub > 0, sub / repetition, sub * repetition)
    sub = torch.where(seen, penalized, sub)
    frequency = column([p.frequency_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    sub = sub - frequency * counts - presence * in_output
    out = logits.clone()
    out[rows] = sub
    return out


def apply_logit_bias(logits: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
    """OpenAI's logit_bias: each listed token's logit plus its bias, after the penalties (so
    a bias of -100 bans a token, +100 all but forces it). Ids past the vocabulary are skipped
    (the frontend refuses them; a worker never indexes out of range)."""
    rows = [i for i, c in enumerate(chunks) if c.sampling.logit_bias]
    if not rows:
        return logits
    out = logits.clone()
    vocab = logits.shape[1]
    for i in rows:
        bias = {t: b for t, b in (chunks[i].sampling.logit_bias or {}).items() if 0 <= t < vocab}
        if bias:
            ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
            values = torch.tensor(list(bias.values()), dtype=out.dtype, device=logits.device)
            out[i].index_add_(0, ids, values)
    return out


def apply_min_tokens(logits: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
    """vLLM's min_tokens: while a request has fewer output tokens than its min_tokens, its
    masked ids (stop_token_ids, and EOS unless ignore_eos) get -inf, so they are never sampled
    (not merely ignored as stops). The count is the chunk's own (outputs before the sampled
    position), so a bundle's later decode steps and a recomputed request mask exactly as a
    lone step would."""
    rows = [
        i
        for i, c in enumerate(chunks)
        if c.sampling.min_tokens_masked and c.end_pos - c.num_prompt_tokens < c.sampling.min_tokens
    ]
    if not rows:
        return logits
    out = logits.clone()
    vocab = logits.shape[1]
    for i in rows:
        ids = [t for t in chunks[i].sampling.min_tokens_masked if 0 <= t < vocab]
        if ids:
            out[i, torch.tensor(ids, dtype=torch.long, device=logits.device)] = -math.inf
    return out


def _padded(seqs: list[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    return torch.tensor(
        [list(s) + [pad] * (width - len(s)) for s in seqs], dtype=torch.long, device=device
    ).view(len(seqs), width)
