"""Pooling for embedding requests: mean / CLS / last token, normalize, Matryoshka `dimensions`.

The pooling of a sentence-transformers directory is read from its `modules.json`: the Pooling
module's `config.json` gives the mode, a Normalize module turns normalization on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from worker.config import UnsupportedModelError

POOLING_MODES = ("mean", "cls", "last")
# sentence-transformers' Pooling config flags -> our modes
_ST_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
             "pooling_mode_lasttoken": "last"}
_ST_NAMES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


@dataclass(frozen=True)
class PoolingConfig:
    mode: str
    normalize: bool

    @classmethod
    def from_dir(cls, model_dir: Path, default: PoolingConfig) -> PoolingConfig:
        """The directory's sentence-transformers pipeline, or `default` when it has none."""
        modules_path = Path(model_dir) / "modules.json"
        if not modules_path.is_file():
            return default
        mode, normalize = default.mode, False
        for module in json.loads(modules_path.read_text()):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                config = json.loads((Path(model_dir) / module["path"] / "config.json").read_text())
                mode = _st_mode(config)
            elif kind == "Normalize":
                normalize = True
            elif kind != "Transformer":
                raise UnsupportedModelError(f"sentence-transformers module {module.get('type')!r}"
                                            " is not supported (Transformer, Pooling, Normalize)")
        return cls(mode, normalize)


def _st_mode(config: dict[str, Any]) -> str:
    if isinstance(config.get("pooling_mode"), str):
        name = config["pooling_mode"]
        if name not in _ST_NAMES:
            raise UnsupportedModelError(f"pooling mode {name!r} is not supported")
        return _ST_NAMES[name]
    on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if len(on) != 1 or on[0] not in _ST_FLAGS:
        raise UnsupportedModelError(f"pooling {on or 'none'} is not supported; one of "
                                    f"{', '.join(_ST_FLAGS)}")
    return _ST_FLAGS[on[0]]


@dataclass
class EmbedItem:
    request_id: str
    token_ids: list[int]
    normalize: bool | None = None  # None: as the model's pooling config says
    dimensions: int = 0  # 0: the model's full size; else keep the first `dimensions` values


def pool(hidden: torch.Tensor, seq_lens: list[int], mode: str) -> torch.Tensor:
    """Flat hidden states [T, H] of consecutive sequences -> one float32 vector each [S, H]."""
    lens = torch.tensor(seq_lens, device=hidden.device)
    ends = lens.cumsum(0)
    if mode == "cls":
        return hidden[ends - lens].float()
    if mode == "last":
        return hidden[ends - 1].float()
    if mode == "mean":
        seq_of_row = torch.repeat_interleave(torch.arange(len(seq_lens), device=hidden.device),
                                             lens)
        sums = hidden.new_zeros(len(seq_lens), hidden.shape[1], dtype=torch.float32)
        return sums.index_add_(0, seq_of_row, hidden.float()) / lens.unsqueeze(1)
    raise ValueError(f"unknown pooling mode {mode!r} ({', '.join(POOLING_MODES)})")


def finish(pooled: torch.Tensor, items: list[EmbedItem], default_normalize: bool
           ) -> list[list[float]]:
    """Matryoshka truncation first, then normalization, so a truncated vector is unit length."""
    out: list[list[float]] = []
    for vector, item in zip(pooled.float().cpu(), items, strict=True):
        if item.dimensions:
            vector = vector[:item.dimensions]
        normalize = default_normalize if item.normalize is None else item.normalize
        if normalize:
            vector = F.normalize(vector, dim=-1)
        out.append(vector.tolist())
    return out


def check_item(item: EmbedItem, vocab_size: int, max_len: int, size: int) -> str | None:
    """Why this item cannot be embedded, or None."""
    if not item.token_ids:
        return "an embedding input needs at least one token"
    if len(item.token_ids) > max_len:
        return f"{len(item.token_ids)} tokens exceed max_model_len {max_len}"
    if min(item.token_ids) < 0 or max(item.token_ids) >= vocab_size:
        return f"token id outside the vocabulary [0, {vocab_size})"
    if not 0 <= item.dimensions <= size:
        return f"dimensions must be in [1, {size}], got {item.dimensions}"
    return None


def flat_inputs(items: list[EmbedItem], vocab_size: int, max_len: int, size: int,
                device: torch.device) -> tuple[list[int], torch.Tensor]:
    """Validates a batch of embedding inputs; returns their lengths and one flat id tensor."""
    for item in items:
        if (error := check_item(item, vocab_size, max_len, size)):
            raise ValueError(f"request {item.request_id}: {error}")
    lens = [len(item.token_ids) for item in items]
    ids = torch.tensor([t for item in items for t in item.token_ids], device=device)
    return lens, ids
