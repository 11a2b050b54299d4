"""Next-token sampling for a batch of requests, each with its own parameters, in tensor ops.

Order, as in vLLM: raw logprobs (if asked) -> penalties -> grammar masks (structured
outputs, worker/sample/constraints.py) -> greedy argmax, or temperature -> min-p -> top-k -> top-p
-> draw. Logprobs are the model's raw log-softmax, before penalties, masks, temperature and
filtering (vLLM's default `raw_logprobs` mode), so they describe the model, not the sampling
settings. A row whose logits hold NaN or inf fails alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import ModuleType

import torch

from worker.runner.batch import SeqChunk
from worker.sample.constraints import Masks, apply_masks
from worker.sample.penalties import apply_logit_bias, apply_min_tokens, apply_penalties


@dataclass
class TokenLogprobs:
    logprob: float  # of the sampled token
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class PromptLogprobs:
    start: int  # the prompt token of entries[0] (>= 1: the first prompt token has none)
    token_ids: list[int]
    entries: list[TokenLogprobs]


@dataclass
class Sample:
    """A chunk's output. A chunk that samples nothing has none, unless it scored prompt tokens:
    then only prompt_logprobs (or error) is set, and token_id means nothing."""

    token_id: int = -1
    logprobs: TokenLogprobs | None = None
    error: str | None = None  # set: this request failed; token_id means nothing
    prompt_logprobs: PromptLogprobs | None = None
    # Speculative decoding: the draft tokens kept ahead of token_id, and their logprobs when
    # asked for (worker/sample/verify.py)
    accepted_ids: list[int] = field(default_factory=list)
    accepted_logprobs: list[TokenLogprobs] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_ids)


NONFINITE_LOGITS = "the model produced NaN or infinite logits"
# Below this temperature a row is greedy, as in vLLM: dividing logits by a subnormal
# temperature overflows to inf, and the draw then picks token 0 instead of the argmax.
MIN_TEMPERATURE = 1e-5


def position_generator(seed: int, position: int) -> torch.Generator:
    """A generator that depends only on (seed, position), not on batch or history.

    A request recomputed on another worker (or in another batch) then draws the same token.
    """
    digest = hashlib.sha256(f"{seed}:{position}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


# Top-p rows look for their nucleus among this many most likely tokens first: `topk` of 1024
# of a vocabulary costs a small fraction of a full sort (docs/performance.md, "Sampler and
# elementwise kernels"). A row whose 1024 best tokens hold less than top_p of the mass falls
# back to the full sort, so the result is exact.
TOP_P_CANDIDATES = 1024


def filter_logits(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """[n, V] temperature-scaled logits -> the same with filtered-out tokens at -inf.

    Per row: min_p (0 = off), top_k (0 = off; ties with the k-th value stay), top_p (1 = off;
    the most likely token always stays).
    """
    if bool((min_p > 0).any()):
        probs = torch.softmax(logits, dim=-1)
        floor = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    use_k, use_p = bool((top_k > 0).any()), bool((top_p < 1).any())
    if not (use_k or use_p):
        return logits
    vocab = logits.shape[1]
    if use_k:
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        best = logits.topk(int(k.max()), dim=-1).values
        kth = best.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th stay
    if not use_p:
        return logits
    probs = torch.softmax(logits, dim=-1)
    n = _candidates(logits, top_k, top_p)
    sorted_probs, order = probs.topk(n, dim=-1)
    k_rows = top_k > 0
    if n < vocab and bool(((sorted_probs.sum(dim=-1) < top_p) & ~k_rows).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # a flat row: exact fallback
    # drop a token once the tokens before it already reach top_p
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p.unsqueeze(1)
    kept = torch.full_like(logits, float("-inf"))
    return kept.scatter_(1, order, logits.gather(1, order).masked_fill(drop, float("-inf")))


def _candidates(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> int:
    """How many of each row's most likely tokens certainly hold every token that survives:
    all of a top-k row's survivors (ties included), TOP_P_CANDIDATES for a top-p-only row
    (checked by the caller), the whole vocabulary when a row filters nothing."""
    vocab = logits.shape[1]
    k_rows = top_k > 0
    if not bool((k_rows | (top_p < 1)).all()):
        return vocab
    alive = (logits > float("-inf")).sum(dim=-1)
    n = int(alive[k_rows].max()) if bool(k_rows.any()) else 0
    if not bool(k_rows.all()):
        n = max(n, TOP_P_CANDIDATES)
    return min(n, vocab)


def plain_greedy(chunk: SeqChunk) -> bool:
    """Whether the chunk's token is its logits' first largest index and nothing else is read
    of them: greedy, no logprobs, penalties, logit bias, min_tokens mask or grammar (a
    greedy row with top_k 1 and a temperature draws among ties: not plain)."""
    sp = chunk.sampling
    return (
        sp.temperature < MIN_TEMPERATURE
        and sp.logprobs < 0
        and not sp.has_penalties
        and not sp.logit_bias
        and not sp.min_tokens_masked
        and chunk.constraint is None
    )


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N] bool: the rows holding neither NaN nor inf."""
    # A NaN or inf makes its row's sum non-finite, and a sum reads the row once without a
    # [N, V] mask (far faster at decode sizes). Only a sum that overflowed on finite values
    # would mislead, so a row that looks bad is checked exactly.
    finite = torch.isfinite(logits.sum(dim=-1))
    if bool(finite.all()):
        return finite
    return torch.isfinite(logits).all(dim=-1)


class Sampler:
    def __init__(self, seed: int = 0, native: ModuleType | None = None) -> None:
        # Requests without a seed draw from one worker-wide stream.
        self.generator = torch.Generator().manual_seed(seed)
        # The compiled CPU kernels (worker/native.py), for the greedy argmax (torch's CPU
        # argmax over a vocabulary row is many times slower than a sum over it) and the grammar
        # masks (worker/csrc/masks.cpp).
        self.native = native

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Each (finite) row's first largest index, as torch.argmax."""
        if self.native is not None and logits.device.type == "cpu":
            return self.native.argmax_rows(logits)
        return logits.argmax(dim=-1)

    def __call__(
        self, logits: torch.Tensor, chunks: list[SeqChunk], masks: Masks | None = None
    ) -> list[Sample]:
        """logits [N, V] (one row per sampling chunk) -> one Sample per row; `masks`: the
        tokens each structured row's grammar allows (a row whose grammar failed fails),
        written into `logits` in place: the caller hands over a tensor it no longer needs."""
        logits = logits.float()
        finite = finite_rows(logits)
        failed = set((~finite).nonzero().flatten().tolist())
        if failed:
            logits = logits.masked_fill(~finite.unsqueeze(1), 0.0)  # keep the rest well-defined
        want = [i for i, c in enumerate(chunks) if c.sampling.logprobs >= 0 and i not in failed]
        raw = torch.log_softmax(logits[want], dim=-1) if want else None
        logits = apply_min_tokens(apply_logit_bias(apply_penalties(logits, chunks), chunks), chunks)
        if masks is not None:
            logits = apply_masks(logits, masks, self.native)
        tokens = self._draw(logits, chunks).tolist()
        samples = [Sample(token) for token in tokens]
        if raw is not None:
            for row, lp in zip(
                want,
                _logprobs(
                    raw, [tokens[i] for i in want], [chunks[i].sampling.logprobs for i in want]
                ),
                strict=True,
            ):
                samples[row].logprobs = lp
        for row in failed:
            samples[row] = Sample(error=NONFINITE_LOGITS)
        for row, error in (masks.errors if masks is not None else {}).items():
            samples[row] = Sample(error=error)
        return samples

    def _draw(self, logits: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
        tokens = self._argmax(logits)  # finite: non-finite rows were zeroed
        rows = [
            i
            for i, c in enumerate(chunks)
            if c.sampling.temperature >= MIN_TEMPERATURE and c.sampling.top_k != 1
        ]
        if not rows:
            return tokens.cpu()
        device = logits.device
        picked = [chunks[i] for i in rows]
        params = [c.sampling for c in picked]

        def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        scaled = logits[rows] / column([p.temperature for p in params], torch.float32)[:, None]
        filtered = filter_logits(
            scaled,
            column([p.top_k for p in params], torch.long),
            column([p.top_p for p in params], torch.float32),
            column([p.min_p for p in params], torch.float32),
        )
        probs = torch.softmax(filtered, dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, one noise row per request.
        noise = self._noise(picked, probs.shape[1]).to(device)
        tokens[rows] = (probs / noise).argmax(dim=-1)
        return tokens.cpu()

    def _noise(self, chunks: list[SeqChunk], vocab: int) -> torch.Tensor:
        noise = torch.empty(len(chunks), vocab)
        unseeded = [i for i, c in enumerate(chunks) if c.sampling.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), vocab).exponential_(
                generator=self.generator
            )
        for i, chunk in enumerate(chunks):
            seed = chunk.sampling.seed
            if seed is not None:
                noise[i].exponential_(generator=position_generator(seed, chunk.end_pos))
        return noise


def score_tokens(
    logits: torch.Tensor, targets: list[int], top_n: int
) -> list[TokenLogprobs] | None:
    """Raw logprob of targets[r] under logits row r, with the row's top N; None when any row is
    not finite (the request fails, as a sampling row would)."""
    logits = logits.float()
    if not bool(finite_rows(logits).all()):
        return None
    return _logprobs(torch.log_softmax(logits, dim=-1), targets, [top_n] * len(targets))


def _logprobs(raw: torch.Tensor, tokens: list[int], counts: list[int]) -> list[TokenLogprobs]:
    chosen = raw.gather(1, torch.tensor(tokens, device=raw.device).unsqueeze(1)).flatten()
    top_n = max(counts)
    top_vals, top_ids = raw.topk(top_n, dim=-1) if top_n else (raw[:, :0], raw[:, :0].long())
    chosen_l, vals_l, ids_l = chosen.tolist(), top_vals.tolist(), top_ids.tolist()
    return [TokenLogprobs(chosen_l[r], ids_l[r][:n], vals_l[r][:n]) for r, n in enumerate(counts)]
