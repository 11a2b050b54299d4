"""Limits of the wire protocol that the frontend checks and the worker enforces: one definition
both import (a leaf module: no torch, no web framework)."""

# Most logprobs (top alternatives) per token, sampled or prompt: OpenAI's own bound for
# completions' `logprobs` and chat's `top_logprobs`.
MAX_LOGPROBS = 20
