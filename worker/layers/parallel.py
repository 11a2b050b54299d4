"""Megatron-style sharded layers for a tensor-parallel group, and the choice between them and
the plain layers (`attention_layers`, `mlp_layers`, `vocab_layers`): a group of size 1 gets
exactly the single-process layers.

- column-parallel (q/k/v, gate/up): each rank holds its rows of the output; no communication;
- row-parallel (o_proj, down_proj): each rank holds the columns matching its inputs, computes a
  partial product, and an all-reduce sums them; the bias is added once, after the sum;
- vocabulary-parallel embedding: each rank looks up the ids in its rows (zero elsewhere) and
  an all-reduce sums them (adding zeros: the same bits as one full lookup);
- vocabulary-parallel LM head: each rank computes its rows' logits, an all-gather joins them,
  so every rank holds the full logits and samples the same token from the same seed.

Each sharded layer tells the loader which slice of the checkpoint tensor it takes
(`checkpoint_piece`), which the loader reads with safetensors' `get_slice`: no rank
materializes a whole tensor. They subclass the plain layers, so on CPU the same oneDNN
prepacking (`prepare_for_cpu`) applies to the shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worker.config import ModelConfig
from worker.layers.embedding import Embedding, LMHead
from worker.layers.linear import Linear, PackedLinear
from worker.parallel.distributed import TPGroup, VocabShard, split_heads


@dataclass(frozen=True)
class Piece:
    """What a parameter takes of a checkpoint tensor: `source` indexes it (one slice per
    dimension), `rows` are the parameter's rows it fills (None: as the loader decides)."""

    source: tuple[slice, ...]
    rows: slice | None = None


class ColumnParallelPacked(PackedLinear):
    """q/k/v or gate/up, holding this rank's rows of each: `sources` names, per checkpoint
    tensor, the rows it takes (weight and bias alike)."""

    def __init__(self, in_features: int, sources: dict[str, slice], bias: bool = False) -> None:
        super().__init__(in_features, {n: s.stop - s.start for n, s in sources.items()}, bias)
        self.sources = dict(sources)

    def checkpoint_piece(self, param: str, shard: str | None) -> Piece:
        assert shard is not None
        return Piece((self.sources[shard],))


class RowParallelLinear(Linear):
    """The columns `cols` of the checkpoint weight; partial products summed over the group."""

    def __init__(
        self, in_features: int, out_features: int, cols: slice, group: TPGroup, bias: bool
    ) -> None:
        super().__init__(in_features, out_features, bias)
        self.cols = cols
        self.group = group

    def checkpoint_piece(self, param: str, shard: str | None) -> Piece | None:
        return Piece((slice(None), self.cols)) if param == "weight" else None  # bias: whole

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight) if self.cpu_matmul is None else self.cpu_matmul(x)
        self.group.all_reduce(y)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(Embedding):
    def __init__(self, vocab_size: int, dim: int, group: TPGroup) -> None:
        self.shard = VocabShard.of(vocab_size, group.rank, group.size)
        super().__init__(self.shard.per_rank, dim)
        self.group = group
        with torch.no_grad():
            self.weight[self.shard.stop - self.shard.start :].zero_()  # padding rows

    def checkpoint_piece(self, param: str, shard: str | None) -> Piece:
        s = self.shard
        return Piece((slice(s.start, s.stop),), rows=slice(0, s.stop - s.start))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = self.shard
        mine = (ids >= s.start) & (ids < s.stop)
        local = torch.where(mine, ids - s.start, torch.zeros_like(ids))
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.group.all_reduce(out)


class ParallelLMHead(LMHead):
    def __init__(
        self, dim: int, vocab_size: int, group: TPGroup, tied_to: VocabParallelEmbedding | None
    ) -> None:
        self.shard = VocabShard.of(vocab_size, group.rank, group.size)
        super().__init__(dim, self.shard.per_rank, tied_to=tied_to)
        self.vocab_size = vocab_size
        self.group = group
        if tied_to is None:
            with torch.no_grad():
                self.weight[self.shard.stop - self.shard.start :].zero_()

    def checkpoint_piece(self, param: str, shard: str | None) -> Piece:
        s = self.shard
        return Piece((slice(s.start, s.stop),), rows=slice(0, s.stop - s.start))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = super().forward(hidden)
        return self.group.all_gather_last(local)[..., : self.vocab_size]


def attention_layers(cfg: ModelConfig, tp: TPGroup) -> tuple[PackedLinear, Linear, int, int]:
    """q/k/v and o projections, and this rank's number of query and KV heads."""
    hd, hidden = cfg.head_dim, cfg.hidden_size
    if tp.size == 1:
        qkv = PackedLinear(
            hidden,
            {"q": cfg.num_heads * hd, "k": cfg.num_kv_heads * hd, "v": cfg.num_kv_heads * hd},
            bias=cfg.qkv_bias,
        )
        o = Linear(cfg.num_heads * hd, hidden, bias=cfg.o_bias)
        return qkv, o, cfg.num_heads, cfg.num_kv_heads
    split = split_heads(cfg.num_heads, cfg.num_kv_heads, tp.rank, tp.size)
    q = slice(split.q_start * hd, (split.q_start + split.q_heads) * hd)
    kv = slice(split.kv_start * hd, (split.kv_start + split.kv_heads) * hd)
    qkv = ColumnParallelPacked(hidden, {"q": q, "k": kv, "v": kv}, bias=cfg.qkv_bias)
    o = RowParallelLinear(split.q_heads * hd, hidden, q, tp, bias=cfg.o_bias)
    return qkv, o, split.q_heads, split.kv_heads


def mlp_layers(cfg: ModelConfig, tp: TPGroup) -> tuple[PackedLinear, Linear]:
    """gate/up and down projections."""
    width, hidden = cfg.intermediate_size, cfg.hidden_size
    if tp.size == 1:
        gate_up = PackedLinear(hidden, {"gate": width, "up": width}, bias=cfg.mlp_bias)
        return gate_up, Linear(width, hidden, bias=cfg.mlp_bias)
    per = width // tp.size
    mine = slice(tp.rank * per, (tp.rank + 1) * per)
    gate_up = ColumnParallelPacked(hidden, {"gate": mine, "up": mine}, bias=cfg.mlp_bias)
    return gate_up, RowParallelLinear(per, hidden, mine, tp, bias=cfg.mlp_bias)


def vocab_layers(cfg: ModelConfig, tp: TPGroup) -> tuple[Embedding, LMHead]:
    """The token embedding and the LM head (tied to it when the config says so)."""
    if tp.size == 1:
        embed = Embedding(cfg.vocab_size, cfg.hidden_size)
        tied = embed if cfg.tie_word_embeddings else None
        return embed, LMHead(cfg.hidden_size, cfg.vocab_size, tied_to=tied)
    pembed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
    ptied = pembed if cfg.tie_word_embeddings else None
    return pembed, ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp, tied_to=ptied)
