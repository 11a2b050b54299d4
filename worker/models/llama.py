"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over paged KV memory.

Parameter names follow the Hugging Face checkpoints, except that q/k/v and gate/up are packed
into one matmul each; `packed_modules` tells the loader which checkpoint tensor fills which rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from worker.attention.base import AttentionBackend
from worker.attention.dense import DensePlan, dense_attention
from worker.config import ModelConfig
from worker.layers.activation import silu_and_mul
from worker.layers.embedding import Embedding, LMHead
from worker.layers.linear import Linear, PackedLinear
from worker.layers.norm import RMSNorm
from worker.layers.rotary import RotaryEmbedding, apply_rotary


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = PackedLinear(
            cfg.hidden_size,
            {
                "q": cfg.num_heads * cfg.head_dim,
                "k": cfg.num_kv_heads * cfg.head_dim,
                "v": cfg.num_kv_heads * cfg.head_dim,
            },
            bias=cfg.qkv_bias,
        )
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.backend = backend
        # Bound to this layer's slice of the paged KV memory by the model runner.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan: Any
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = apply_rotary(q.view(tokens, self.num_heads, self.head_dim), *rope)
        k = apply_rotary(k.view(tokens, self.num_kv_heads, self.head_dim), *rope)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if isinstance(plan, DensePlan):  # an embedding pass: nothing is kept in the cache
            out = dense_attention(q, k, v, plan, self.scale)
        else:
            out = self.backend.forward(q, k, v, self.k_cache, self.v_cache, plan, self.scale)
        return self.o_proj(out.reshape(tokens, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = PackedLinear(
            cfg.hidden_size,
            {"gate": cfg.intermediate_size, "up": cfg.intermediate_size},
            bias=cfg.mlp_bias,
        )
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan: Any
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, backend) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        rope = self.rotary(positions)  # looked up once, used by every layer
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, rope, plan)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    # checkpoint module name -> (our packed module, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, backend, max_positions, dtype)
        tied = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tied_to=tied)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        """Flat varlen batch [T] -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, plan)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[LlamaAttention]:
        return [layer.self_attn for layer in self.model.layers]
