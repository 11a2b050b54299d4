"""Next-token sampling per request: greedy, temperature, top-k, top-p, per-position seeds."""

from __future__ import annotations

import hashlib

import torch

from worker.batch import SeqChunk


def position_generator(seed: int, position: int) -> torch.Generator:
    """A generator that depends only on (seed, position), not on batch or history.

    A request recomputed on another worker (or in another batch) then draws the same token.
    """
    digest = hashlib.sha256(f"{seed}:{position}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int,
                   top_p: float) -> torch.Tensor:
    """[V] float32 logits -> probabilities after temperature, top-k and top-p."""
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # drop a token once the tokens before it already reach top_p (the first always stays)
        drop = sorted_probs.cumsum(0) - sorted_probs >= top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    return probs


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        # Requests without a seed draw from one worker-wide stream.
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, chunks: list[SeqChunk]) -> list[int]:
        """logits [N, V] (one row per sampling chunk) -> one token id per row."""
        logits = logits.float().cpu()
        greedy = logits.argmax(dim=-1).tolist()
        tokens: list[int] = []
        for row, chunk in enumerate(chunks):
            if chunk.temperature <= 0 or chunk.top_k == 1:
                tokens.append(greedy[row])
                continue
            probs = filtered_probs(logits[row], chunk.temperature, chunk.top_k, chunk.top_p)
            gen = (position_generator(chunk.seed, chunk.end_pos) if chunk.seed is not None
                   else self.generator)
            tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
        return tokens
