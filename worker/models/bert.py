"""BERT-family encoder (all-MiniLM-L6-v2, bge-small, e5-small): bidirectional, no KV cache.

Module names mirror Hugging Face's `BertModel` so checkpoint tensors load by name; only q/k/v
are packed into one matmul (`packed_modules`). The pooler head is not used by
sentence-transformers and is skipped. Checkpoints saved from a model with a head
(BertForMaskedLM, BertForPreTraining, or a BertModel inside a wrapper) prefix the encoder's
tensors with `bert.`: the loader strips it when the unprefixed names are absent, and the heads
(`cls.*`) are skipped.

A cross-encoder (`BertForSequenceClassification`) keeps what sentence-transformers'
`CrossEncoder` runs on a text pair: token types (0 for the first text, 1 for the second), the
pooler (dense + tanh on each sequence's first token) and the classifier on top of it.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.attention.dense import DensePlan, dense_attention
from worker.config import EncoderConfig
from worker.layers.activation import ACTIVATIONS
from worker.layers.embedding import Embedding
from worker.layers.linear import Linear, PackedLinear
from worker.layers.module import Module
from worker.layers.norm import LayerNorm


class BertEmbeddings(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`types` None: single-text inputs, every token of token type 0."""
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        table = self.token_type_embeddings
        return self.LayerNorm(x + (table.weight[0] if types is None else table(types)))


class BertSelfAttention(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = PackedLinear(
            cfg.hidden_size, dict.fromkeys("qkv", cfg.hidden_size), bias=True
        )

    def forward(self, x: torch.Tensor, plan: DensePlan) -> torch.Tensor:
        q, k, v = (
            t.view(x.shape[0], self.num_heads, self.head_dim)
            for t in self.qkv_proj.split(self.qkv_proj(x))
        )
        return dense_attention(q, k, v, plan, self.scale).flatten(1)


class BertResidualOut(Module):
    """dense -> + residual -> LayerNorm (HF's BertSelfOutput and BertOutput)."""

    def __init__(self, cfg: EncoderConfig, in_features: int) -> None:
        super().__init__()
        self.dense = Linear(in_features, cfg.hidden_size, bias=True)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertResidualOut(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, plan: DensePlan) -> torch.Tensor:
        return self.output(self.self(x, plan), x)


class BertIntermediate(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertResidualOut(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, plan: DensePlan) -> torch.Tensor:
        x = self.attention(x, plan)
        return self.output(self.intermediate(x), x)


class BertEncoder(Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))


class BertModel(Module):
    packed_modules = {
        "query": ("qkv_proj", "q"),
        "key": ("qkv_proj", "k"),
        "value": ("qkv_proj", "v"),
    }
    # names after stripping a `checkpoint_prefixes` entry; `cls.` is the pretraining heads
    ignored_weights = ("embeddings.position_ids", "pooler.", "cls.")
    checkpoint_prefixes = ("bert.",)

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        plan: DensePlan,
        types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flat varlen batch [T] -> last hidden states [T, hidden]."""
        x = self.embeddings(input_ids, positions, types)
        for layer in self.encoder.layer:
            x = layer(x, plan)
        return x


class BertPooler(Module):
    """transformers' BertPooler: tanh(dense(x)) of each sequence's first token."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first_tokens))


class BertForSequenceClassification(Module):
    """The encoder under `bert.` (with its pooler) and `classifier`, as the checkpoint names
    them; `forward` gives hidden states like `BertModel`, `classify` the logits of each
    sequence from its first token's hidden state (dropout is off at inference)."""

    packed_modules = BertModel.packed_modules
    ignored_weights = ("bert.embeddings.position_ids",)

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.bert.pooler = BertPooler(cfg)
        self.classifier = Linear(cfg.hidden_size, cfg.num_labels, bias=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        plan: DensePlan,
        types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.bert(input_ids, positions, plan, types)

    def classify(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """[S, hidden] first-token states -> [S, num_labels] logits."""
        return self.classifier(self.bert.pooler(first_tokens))
