"""`--speculative-config`: vLLM's JSON shape, read and checked when the flags are.

The scheduler's core drafts (scheduler_svc/core/speculative.py, whose `SpecConfig` takes the
fields this returns); this module only turns the flag's text into those fields, so that a bad
value stops the service at startup naming the key, not when the first worker registers.
"""

from __future__ import annotations

import json
from typing import Any

METHODS = ("ngram", "suffix")  # scheduler_svc/core/speculative.py: METHODS
# vLLM's key for the suffix method's factor, and ours in the core
_RENAMED = {"suffix_decoding_max_spec_factor": "max_spec_factor"}
_INTS = (
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
)
_KEYS = ("method", *_INTS, *_RENAMED)
MAX_SPECULATIVE_TOKENS = 16


def parse_speculative_config(text: str) -> dict[str, Any] | None:
    """The core's SpecConfig fields, or None for '' (off). ValueError names what is wrong."""
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"speculative_config is not JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError("speculative_config must be a JSON object")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"speculative_config: unknown keys {unknown}; known: {list(_KEYS)}")
    method = raw.get("method", "ngram")
    if method not in METHODS:
        raise ValueError(f"speculative_config: method must be one of {METHODS}, got {method!r}")
    if "num_speculative_tokens" not in raw:
        raise ValueError("speculative_config: num_speculative_tokens is required")
    fields: dict[str, Any] = {"method": method}
    for key in _INTS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config: {key} must be a positive integer")
            fields[key] = value
    if fields["num_speculative_tokens"] > MAX_SPECULATIVE_TOKENS:
        raise ValueError(
            f"speculative_config: num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}"
        )
    low = fields.get("prompt_lookup_min", fields.get("prompt_lookup_max", 3))
    fields.setdefault("prompt_lookup_min", min(low, 3))
    fields.setdefault("prompt_lookup_max", max(fields["prompt_lookup_min"], 5))
    if fields["prompt_lookup_min"] > fields["prompt_lookup_max"]:
        raise ValueError("speculative_config: prompt_lookup_min exceeds prompt_lookup_max")
    for key, ours in _RENAMED.items():
        if key in raw:
            value = raw[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"speculative_config: {key} must be a positive number")
            fields[ours] = float(value)
    return fields
