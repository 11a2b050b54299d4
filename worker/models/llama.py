"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over paged KV memory.

Parameter names follow the Hugging Face checkpoints, except that q/k/v and gate/up are packed
into one matmul each; `packed_modules` tells the loader which checkpoint tensor fills which rows.

In a tensor-parallel group (`tp`, size > 1) each rank builds the sharded layers of
`worker/layers/parallel.py`: its query and KV heads, its slice of the MLP and the vocabulary.

The residual stream is carried beside the hidden states from layer to layer, so that each
residual add is done by the norm that follows it (`RMSNorm.add`): on CPU, with the compiled
kernels, the add and the norm are one call, as are SiLU-and-mul and the split of the packed
qkv with RoPE (`use_native`; `worker/csrc/fused.cpp`). The sums are the same as
transformers' `residual + hidden_states`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from worker.attention.base import AttentionBackend
from worker.attention.dense import DensePlan, dense_attention
from worker.config import ModelConfig
from worker.layers.activation import silu_and_mul
from worker.layers.module import Module
from worker.layers.native_ops import UsesNative
from worker.layers.norm import RMSNorm
from worker.layers.parallel import attention_layers, mlp_layers, vocab_layers
from worker.layers.rotary import RotaryEmbedding, apply_rotary
from worker.parallel.distributed import TPGroup


class LlamaAttention(Module, UsesNative):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, tp: TPGroup) -> None:
        super().__init__()
        # this rank's heads (all of them in a single process)
        self.qkv_proj, self.o_proj, self.num_heads, self.num_kv_heads = attention_layers(cfg, tp)
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.backend = backend
        # Bound to this layer's slice of the paged KV memory by the model runner.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan: Any
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        if self.native is not None:
            q, k, v = self.native.split_rope(
                qkv, *rope, self.num_heads, self.num_kv_heads, self.head_dim
            )
        else:
            # q and k are adjacent in the packed output: one rotation for both heads' kinds
            # (half the kernels a decode step launches for RoPE; the same arithmetic)
            _, _, v = self.qkv_proj.split(qkv)
            heads = self.num_heads + self.num_kv_heads
            qk = qkv[:, : heads * self.head_dim].view(tokens, heads, self.head_dim)
            qk = apply_rotary(qk, *rope)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
            v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if isinstance(plan, DensePlan):  # an embedding pass: nothing is kept in the cache
            out = dense_attention(q, k, v, plan, self.scale)
        else:
            out = self.backend.forward(q, k, v, self.k_cache, self.v_cache, plan, self.scale)
        return self.o_proj(out.reshape(tokens, -1))


class LlamaMLP(Module, UsesNative):
    def __init__(self, cfg: ModelConfig, tp: TPGroup) -> None:
        super().__init__()
        self.gate_up_proj, self.down_proj = mlp_layers(cfg, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        act = silu_and_mul(gate_up) if self.native is None else self.native.silu_and_mul(gate_up)
        return self.down_proj(act)


class LlamaDecoderLayer(Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, tp: TPGroup) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, backend, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg, tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        plan: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it is added); the first
        layer gets the embeddings as x and no residual."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add(x, residual)
        h, residual = self.post_attention_layernorm.add(self.self_attn(h, rope, plan), residual)
        return self.mlp(h), residual


class LlamaModel(Module):
    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        dtype: torch.dtype,
        tp: TPGroup,
        embed_tokens: nn.Module,
    ) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, backend, tp) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        rope = self.rotary(positions)  # looked up once, used by every layer
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, plan)
        return self.norm(x) if residual is None else self.norm.add(x, residual)[0]


class LlamaForCausalLM(Module):
    # checkpoint module name -> (our packed module, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        dtype: torch.dtype,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        tp = tp or TPGroup()
        embed, head = vocab_layers(cfg, tp)  # the head may be tied to the embedding
        self.model = LlamaModel(cfg, backend, max_positions, dtype, tp, embed)
        self.lm_head = head  # after the model: a tied weight is named model.embed_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        """Flat varlen batch [T] -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, plan)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[LlamaAttention]:
        return [layer.self_attn for layer in self.model.layers]
