"""Rotary position embedding with Llama's rotate-half layout and the scalings HF checkpoints use.

The inverse frequencies follow transformers' `modeling_rope_utils` formula by formula, so the
cos/sin tables (and hence the logits) agree with it in float32.

Two types change their frequencies with the length of the sequence, `dynamic` (dynamic NTK) and
`longrope` (Phi-3). transformers recomputes them in every forward pass from that pass's largest
position (`dynamic_rope_update`) and never re-rotates the keys already in its cache, so the
keys of one sequence end up rotated with the frequencies of whichever pass computed them. Over
a paged prefix cache, where a block's content must be a function of its tokens alone, that
cannot be reproduced: a block written by a 300-token prefill of one request and read by a
200-token prefill of another (or by the same request after a chunked prefill or a recompute)
would hold keys transformers never computed for that sequence. vLLM keeps its cache consistent
by fixing one set of frequencies for every length — dynamic: the base computed for
`max_position_embeddings * factor`, which its current formula reduces to the unscaled base;
longrope: the long factors at every position whenever max_model_len exceeds the original
length — and so differs from transformers on one side of the threshold or the other.

We follow transformers, and serve these types only up to the length where their frequencies
are still the unscaled ones: `max_position_embeddings` for dynamic (there it is the default
RoPE), `original_max_position_embeddings` for longrope (the short factors, with its attention
scaling). Up to it every split of a sequence into passes, and every cache hit, computes exactly
what transformers computes; a longer `max_model_len` is refused (`max_exact_positions`).
"""

from __future__ import annotations

import math

import torch

from worker.config import RopeConfig, UnsupportedModelError
from worker.layers.module import Module


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (theta**exponents)


def linear_inv_freq(dim: int, theta: float, params: dict) -> torch.Tensor:
    return default_inv_freq(dim, theta) / float(params["factor"])


def llama3_inv_freq(dim: int, theta: float, params: dict) -> torch.Tensor:
    inv_freq = default_inv_freq(dim, theta)
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def yarn_inv_freq(dim: int, theta: float, params: dict) -> tuple[torch.Tensor, float]:
    factor = float(params["factor"])
    old_len = float(params["original_max_position_embeddings"])
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    interpolated, extrapolated = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
    weight = 1 - ramp  # share of the extrapolated (unscaled) frequency
    inv_freq = interpolated * (1 - weight) + extrapolated * weight
    return inv_freq, _yarn_attention_factor(factor, params)


def _yarn_attention_factor(factor: float, params: dict) -> float:
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)


def dynamic_ntk_inv_freq(
    dim: int, theta: float, params: dict, seq_len: int | None = None
) -> torch.Tensor:
    """transformers' `_compute_dynamic_ntk_parameters` for a pass whose largest position is
    `seq_len - 1`; up to `max_position_embeddings` (and for None) it is the default RoPE."""
    factor, max_len = float(params["factor"]), int(params["max_position_embeddings"])
    seq_len = max(seq_len or max_len, max_len)
    base = theta * ((factor * seq_len / max_len) - (factor - 1)) ** (dim / (dim - 2))
    return default_inv_freq(dim, base)


def longrope_inv_freq(
    dim: int, theta: float, params: dict, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """transformers' `_compute_longrope_parameters`: short factors up to the original length,
    long factors past it; the attention scaling does not depend on the length."""
    old_len = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:  # Phi-3: the ratio of the extended and the original lengths
        factor = params["max_position_embeddings"] / old_len
    scale = params.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old_len))
    key = "long_factor" if seq_len and seq_len > old_len else "short_factor"
    ext_factors = torch.tensor(params[key], dtype=torch.float32)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * theta**exponents), float(scale)


def max_exact_positions(rope: RopeConfig) -> int | None:
    """The longest sequence a length-dependent RoPE type is served for (None: no limit).

    Up to it, the frequencies transformers uses do not depend on the sequence length, so any
    split into passes and any prefix-cache hit computes what transformers computes."""
    if rope.type == "dynamic":
        return int(rope.params["max_position_embeddings"])
    if rope.type == "longrope":
        return int(rope.params["original_max_position_embeddings"])
    return None


def inv_freq_and_scale(dim: int, rope: RopeConfig) -> tuple[torch.Tensor, float]:
    if rope.type == "default":
        return default_inv_freq(dim, rope.theta), 1.0
    if rope.type == "linear":
        return linear_inv_freq(dim, rope.theta, rope.params), 1.0
    if rope.type == "llama3":
        return llama3_inv_freq(dim, rope.theta, rope.params), 1.0
    if rope.type == "yarn":
        return yarn_inv_freq(dim, rope.theta, rope.params)
    # The length-dependent types at lengths up to `max_exact_positions` (checked by the caller).
    if rope.type == "dynamic":
        return dynamic_ntk_inv_freq(dim, rope.theta, rope.params), 1.0
    if rope.type == "longrope":
        return longrope_inv_freq(dim, rope.theta, rope.params)
    raise ValueError(f"unsupported RoPE type {rope.type!r}")


class RotaryEmbedding(Module):
    """cos/sin tables for every position up to `max_positions`, looked up once per step."""

    def __init__(
        self, head_dim: int, max_positions: int, rope: RopeConfig, dtype: torch.dtype
    ) -> None:
        super().__init__()
        limit = max_exact_positions(rope)
        if limit is not None and max_positions > limit:
            raise UnsupportedModelError(
                f"RoPE type {rope.type!r} changes its frequencies past {limit} positions, and "
                "transformers then keeps cached keys rotated with the old ones: a paged prefix "
                "cache cannot reproduce that, so this worker serves such a model only up to "
                f"{limit} tokens; max_model_len is {max_positions}: pass --max-model-len {limit} "
                "or less"
            )
        inv_freq, scale = inv_freq_and_scale(head_dim, rope)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", (freqs.cos() * scale).to(dtype), persistent=False)
        self.register_buffer("sin", (freqs.sin() * scale).to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin of shape [T, 1, head_dim / 2] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; rotate-half layout (first half pairs with second half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
