"""Speculative decoding's verdict: which drafted tokens a step keeps.

A chunk with k drafted tokens (`SeqChunk.num_drafts`, scheduler_svc/core/speculative.py) is
sampled at k + 1 positions: from its last known token on, each position as a *view* of the
chunk that ends there, whose history holds the drafts before it. Every view is sampled exactly
as a plain chunk ending at that position would be (the same penalties, min_tokens, logit bias,
logprobs and per-position seed: `sampler.position_generator` reads the view's end), so the
token a view samples is the token sampling would give there without speculation.

The verdict keeps drafts while each equals what its position sampled, then the token sampled at
the first mismatch, or after the last draft. Greedy and seeded requests thus produce the very
tokens they produce without speculation; an unseeded one draws each kept token from the same
distribution (a one-point draft accepted with the probability the model gives it, and otherwise
replaced by a draw from the rest of the distribution: rejection sampling's rule for such a draft).

A chunk under a grammar is sampled at its first position only and keeps no draft: the grammar's
masks after a draft would need the grammar advanced through it (the scheduler drafts for no such
request; this holds even if one came).
"""

from __future__ import annotations

import dataclasses

from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample


def draft_views(chunks: list[SeqChunk], sampling: list[int]) -> list[tuple[int, SeqChunk]]:
    """(index into `sampling`, the view) for every position to sample, in order: one view for a
    chunk without drafts (the chunk itself), k + 1 for a chunk with k."""
    views: list[tuple[int, SeqChunk]] = []
    for owner, index in enumerate(sampling):
        chunk = chunks[index]
        k = chunk.num_drafts
        if not k:
            views.append((owner, chunk))
            continue
        known = len(chunk.token_ids) - k
        drafts = chunk.token_ids[known:]
        for j in range(1 if chunk.constraint is not None else k + 1):
            history = chunk.all_token_ids if not j else [*chunk.all_token_ids, *drafts[:j]]
            view = dataclasses.replace(
                chunk, token_ids=chunk.token_ids[: known + j], all_token_ids=history, num_drafts=0
            )
            views.append((owner, view))
    return views


def view_rows(
    views: list[tuple[int, SeqChunk]],
    sampling: list[int],
    chunks: list[SeqChunk],
    last_rows: list[int],
) -> list[int]:
    """The flat row of the forward pass each view samples from (a view ending d tokens before
    its chunk's last one reads the row d before that chunk's last row)."""
    rows = []
    for owner, view in views:
        chunk = chunks[sampling[owner]]
        rows.append(last_rows[sampling[owner]] - (chunk.end_pos - view.end_pos))
    return rows


def verdicts(
    chunks: list[SeqChunk],
    sampling: list[int],
    views: list[tuple[int, SeqChunk]],
    samples: list[Sample],
) -> list[Sample]:
    """One Sample per sampling chunk: its views' samples folded by the rule above. A view's
    error fails its chunk only where the verdict reaches that view."""
    per_owner: list[list[Sample]] = [[] for _ in sampling]
    for (owner, _), sample in zip(views, samples, strict=True):
        per_owner[owner].append(sample)
    out: list[Sample] = []
    for owner, index in enumerate(sampling):
        chunk, seen = chunks[index], per_owner[owner]
        if len(seen) == 1:
            out.append(seen[0])
            continue
        drafts = chunk.token_ids[len(chunk.token_ids) - chunk.num_drafts :]
        kept = 0
        while (
            kept < len(drafts) and seen[kept].error is None and seen[kept].token_id == drafts[kept]
        ):
            kept += 1
        final = seen[kept]
        if final.error is None:
            final.accepted_ids = list(drafts[:kept])
            if chunk.sampling.logprobs >= 0:
                final.accepted_logprobs = [
                    s.logprobs for s in seen[:kept] if s.logprobs is not None
                ]
        out.append(final)
    return out


def _agrees(sample: Sample, draft: int) -> bool:
    return sample.error is None and sample.token_id == draft
