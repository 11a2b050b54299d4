"""A request's sampling settings as the sampler reads them: one object, carried by every chunk.

The wire's proto3 zeros for "not set" are resolved once, in `worker/link/wire.py`; here every
value means what it says (top_p 1 and repetition_penalty 1 are off, seed None is the
worker-wide stream), so the sampler, the penalties and the chunk checks never look at a wire
message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvledger.structured import StructuredSpec


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    # Per-request seed; the generator is derived per position (seed, position) so the same
    # request recomputed elsewhere samples the same tokens. None: the worker-wide stream.
    seed: int | None = None
    logprobs: int = -1  # -1: none; N >= 0: the sampled token's logprob and the top N
    # -1: none; N >= 0: the logprob of each prompt token a chunk's positions predict (token
    # i + 1 from position i) and the top N. The scheduler gives such requests no cache hit, so
    # some chunk computes every prompt position.
    prompt_logprobs: int = -1
    # OpenAI's logit_bias: token id -> bias added to its logit before sampling (None = none).
    logit_bias: Mapping[int, float] | None = None
    # min_tokens: until the request has this many output tokens, `min_tokens_masked` (its stop
    # ids, and EOS unless ignore_eos) cannot be sampled (worker/sample/penalties.py).
    min_tokens: int = 0
    min_tokens_masked: tuple[int, ...] = ()
    # Constrained decoding: only tokens this grammar allows are sampled
    # (worker/sample/constraints.py).
    structured: StructuredSpec | None = None

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


GREEDY = SamplingParams()
