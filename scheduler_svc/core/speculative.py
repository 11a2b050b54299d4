"""Speculative decoding's drafts: tokens guessed from the request's own text, checked by the
worker in one step.

A decode step reads every weight once whatever the rows, so a step that computes the last token
and k drafted ones costs little more than one that computes the last token alone. The scheduler
drafts (it holds every request's tokens; drafting needs no model), schedules 1 + k tokens, and
the worker samples each of the k + 1 positions as if the drafts before it were the request's
tokens, keeping drafts for as long as they equal what it sampled, plus the token it sampled at
the first mismatch (or after the last draft). Every token kept is thus the token sampling would
have given without speculation: greedy and seeded output are identical, and unseeded output has
the same distribution (rejection sampling with a one-point draft distribution accepts a draft
with the probability the model gives it, and otherwise draws from the rest: the same law).

Two ways to draft, both from the request's prompt and its outputs so far:

- `ngram` (vLLM's prompt lookup): the latest earlier occurrence of the request's last n tokens
  (n from `prompt_lookup_max` down to `prompt_lookup_min`, the longest match winning) proposes
  the `num_speculative_tokens` tokens that followed it;
- `suffix` (suffix decoding's rule): the longest earlier match of the request's tail, up to
  `SUFFIX_MAX_MATCH` tokens, proposes a draft as long as the match times `max_spec_factor`
  (at most `num_speculative_tokens`): long matches, long drafts.

Only while at most `disable_by_batch_size` requests run: a batch of many rows is no longer bound by
reading the weights, and drafts would then cost about what they save.

A request whose drafts were all rejected waits before it drafts again, twice as long each time
(up to `MAX_BACKOFF_STEPS`): text that repeats nothing costs almost nothing.

The ledger's side (core/scheduler.py): drafts count against the token budget; the slots they take
are trimmed back once the worker says how many it kept; a block is hashed and declared written
only once every token in it is known (core/lookahead.py), so KV written for a rejected draft is
never published and never claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

METHODS = ("ngram", "suffix")
SUFFIX_MAX_MATCH = 24  # suffix decoding's default tree depth
MAX_BACKOFF_STEPS = 16
CANDIDATES_PER_KEY = 4  # earlier ends kept per n-gram: the most recent ones


@dataclass(frozen=True)
class SpecConfig:
    """`--speculative-config`, as vLLM names its keys (kvledger/config/speculative.py parses
    and checks the JSON)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 3
    prompt_lookup_max: int = 5
    max_spec_factor: float = 1.0  # suffix: draft length per matched token
    # No drafting while more requests than this run on the worker: a step of many rows is no
    # longer bound by reading the weights, so the rows drafts add cost about what they save.
    disable_by_batch_size: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.num_speculative_tokens < 1 or self.max_spec_factor <= 0:
            raise ValueError("num_speculative_tokens and max_spec_factor must be positive")
        if self.disable_by_batch_size < 1:
            raise ValueError("disable_by_batch_size must be positive")

    @property
    def min_match(self) -> int:
        return self.prompt_lookup_min

    @property
    def max_match(self) -> int:
        return self.prompt_lookup_max if self.method == "ngram" else SUFFIX_MAX_MATCH


@dataclass(slots=True)
class NgramIndex:
    """Where each n-gram of a token list ended, for the lists that only grow (a request's
    tokens): updated with the tokens added since the last look, O(1) a token."""

    n: int
    ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in `ends`

    def catch_up(self, tokens: Sequence[int], upto: int) -> None:
        n, ends = self.n, self.ends
        for end in range(max(self.indexed, n), upto):
            seen = ends.setdefault(tuple(tokens[end - n : end]), [])
            seen.append(end)
            if len(seen) > CANDIDATES_PER_KEY:
                del seen[0]
        self.indexed = max(self.indexed, upto)

    def best_match(self, tokens: Sequence[int], max_match: int) -> tuple[int, int]:
        """(end of the earlier occurrence matching the longest tail, the match length); (0, 0)
        when the last n tokens occurred nowhere before."""
        length = len(tokens)
        self.catch_up(tokens, length)  # n-grams ending before the tail's own end
        if length < self.n:
            return 0, 0
        best_end, best_len = 0, 0
        for end in reversed(self.ends.get(tuple(tokens[length - self.n :]), ())):
            if end >= length:
                continue
            matched = self.n
            while (
                matched < max_match
                and end - matched > 0
                and tokens[end - matched - 1] == tokens[length - matched - 1]
            ):
                matched += 1
            if matched > best_len:
                best_end, best_len = end, matched
        return best_end, best_len


@dataclass(slots=True)
class DraftState:
    """One request's drafting: its index and its backoff. Kept across preemption (its tokens
    only grow; a recompute leaves them as they were)."""

    index: NgramIndex
    backoff: int = 0  # steps to wait after the last fully rejected draft
    wait: int = 0  # steps still to wait

    def tick(self) -> bool:
        """One step of the wait gone; whether it was still waiting."""
        if self.wait > 0:
            self.wait -= 1
            return True
        return False


def propose(config: SpecConfig, state: DraftState, tokens: Sequence[int], limit: int) -> list[int]:
    """Up to `limit` drafted tokens to follow `tokens`, or none (no match, or backing off)."""
    if state.tick():
        return []
    end, matched = state.index.best_match(tokens, config.max_match)
    if matched == 0:
        return []
    size = min(limit, config.num_speculative_tokens)
    if config.method == "suffix":
        size = min(size, max(1, int(matched * config.max_spec_factor)))
    return list(tokens[end : end + size])


def settle(state: DraftState, num_drafted: int, num_accepted: int) -> None:
    """After the worker's verdict: a draft with nothing kept doubles the wait before the next."""
    if num_drafted and not num_accepted:
        state.backoff = min(max(1, 2 * state.backoff), MAX_BACKOFF_STEPS)
        state.wait = state.backoff
    elif num_accepted:
        state.backoff = 0
