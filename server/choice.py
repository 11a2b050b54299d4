"""A generating request's state, endpoint-neutral: each choice's text, tokens, finish reason
and logprob entries, and what of them a stream has sent. server/intake.py fills it from the
scheduler's responses; server/generation.py drives the calls; the routes render it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from protos import frontend_pb2
from server.client import ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.responses import PromptTokensDetails, Usage

LOGPROB_FLOOR = -9999.0  # vLLM's: JSON has no -inf


def json_logprob(value: float) -> float | None:
    """A logprob as JSON can carry it, as vLLM does: -inf (a token the model gives no chance,
    or logits spread beyond float32) is clamped to -9999.0; NaN (the scheduler's mark for a
    logprob the worker did not send) and +inf (never a logprob) are null."""
    if math.isnan(value) or value == math.inf:
        return None
    return max(value, LOGPROB_FLOOR)


@dataclass(frozen=True)
class TokenEntry:
    """A token with its logprob and the top alternatives (those JSON can carry a number for);
    `offset` is where its text starts in the choice's text (-1 for a prompt token)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    offset: int = -1

    @classmethod
    def of(cls, entry: frontend_pb2.TokenLogprob, offset: int = -1) -> TokenEntry:
        top = tuple(
            (t.token_id, lp) for t in entry.top if (lp := json_logprob(t.logprob)) is not None
        )
        return cls(entry.token_id, json_logprob(entry.logprob), top, offset)


@dataclass
class Choice:
    index: int
    prompt_index: int
    request: frontend_pb2.GenerateRequest
    detokenizer: IncrementalDetokenizer
    text: str = ""
    sent: int = 0  # characters of text already streamed
    started: bool = False  # streaming: its first chunk went out
    closed: bool = False  # streaming: the chunk with the finish reason went out
    # max_tokens 0 with echo (OpenAI's way to score a prompt alone): the one token generated
    # to end the request is dropped.
    echo_only: bool = False
    token_ids: list[int] = field(default_factory=list)  # generated so far (usage, continuations)
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    stop_string: str | None = None  # the stop string that ended it, if one did
    entries: list[TokenEntry] | None = None  # with logprobs: one per generated token
    entries_sent: int = 0
    # With prompt logprobs: one per prompt token once the first response came (the first None).
    prompt_entries: list[TokenEntry | None] | None = None

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.request.sampling.HasField("prompt_logprobs")

    def take_entries(self) -> list[TokenEntry]:
        """Streaming: the entries whose text has started going out (all of them at the end),
        so a stop string that later cuts the text never leaves a streamed token behind."""
        if self.entries is None:
            return []
        if self.finish_reason is not None:
            end = len(self.entries)
        else:
            end = sum(1 for e in self.entries if e.offset < self.sent)
        start, self.entries_sent = self.entries_sent, max(self.entries_sent, end)
        return self.entries[start : self.entries_sent]


@dataclass
class Generation:
    id: str
    model: ServedModel
    prompts: list[list[int]]
    stops: list[str]
    choices: list[Choice] = field(default_factory=list)
    # include_stop_str_in_output: a stop string ends the text instead of being cut off
    include_stop: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def holdback(self) -> int:
        """Characters a stream keeps back: a stop string may still be forming in them."""
        return max(max((len(s) for s in self.stops), default=0) - 1, 0)

    def usage(self) -> Usage:
        prompt_tokens = sum(len(p) for p in self.prompts)
        completion_tokens = sum(len(c.token_ids) for c in self.choices)
        cached = [0] * len(self.prompts)
        for c in self.choices:
            cached[c.prompt_index] = max(cached[c.prompt_index], c.num_cached_tokens)
        return Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached)),
        )


def stream_text(choice: Choice, holdback: int) -> str:
    """Text of a choice that is safe to send now (a stop string may still be forming)."""
    if choice.finish_reason:
        end = len(choice.text)
    else:
        end = max(choice.sent, len(choice.text) - holdback)
    delta = choice.text[choice.sent : end]
    choice.sent = end
    return delta
