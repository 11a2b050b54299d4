"""Pooling for embedding requests: mean / CLS / last token, normalize, Matryoshka `dimensions`.

The pooling of a sentence-transformers directory is read from its `modules.json`: the Pooling
module's `config.json` gives the mode, a Normalize module turns normalization on, and Dense
modules after the Pooling (encoders only) project the pooled vector: a linear layer and its
activation, as sentence-transformers' `Dense` computes them (`DenseHead`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from worker.config import UnsupportedModelError
from worker.layers.module import Module

POOLING_MODES = ("mean", "cls", "last")
# sentence-transformers' Pooling config flags -> our modes
_ST_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_ST_NAMES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


# sentence-transformers saves a Dense activation as the class's full name; torch's own only.
DENSE_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "Tanh": nn.Tanh,
    "Identity": nn.Identity,
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
    "SiLU": nn.SiLU,
}
_DENSE_INPUT = "sentence_embedding"


@dataclass(frozen=True)
class DenseConfig:
    """One sentence-transformers Dense module: `activation(linear(x))` [+ residual]."""

    path: str  # its folder, relative to the model directory
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # a DENSE_ACTIVATIONS key
    residual: bool = False

    @classmethod
    def from_dir(cls, model_dir: Path, path: str) -> DenseConfig:
        config = json.loads((Path(model_dir) / path / "config.json").read_text())
        for key in ("module_input_name", "module_output_name"):
            if config.get(key) not in (None, _DENSE_INPUT):
                raise UnsupportedModelError(
                    f"Dense module {path!r}: {key} {config[key]!r} is "
                    f"not supported (only {_DENSE_INPUT!r})"
                )
        # sentence-transformers' default, also when an untrusted name makes it fall back
        name = str(config.get("activation_function") or "torch.nn.modules.activation.Tanh")
        short = name.rsplit(".", 1)[-1]
        if not name.startswith("torch.") or short not in DENSE_ACTIVATIONS:
            raise UnsupportedModelError(
                f"Dense module {path!r}: activation {name!r} is not "
                f"supported ({', '.join(DENSE_ACTIVATIONS)})"
            )
        return cls(
            path=path,
            in_features=int(config["in_features"]),
            out_features=int(config["out_features"]),
            bias=bool(config.get("bias", True)),
            activation=short,
            residual=bool(config.get("use_residual", False)),
        )


@dataclass(frozen=True)
class PoolingConfig:
    mode: str
    normalize: bool
    dense: tuple[DenseConfig, ...] = ()  # applied in order to the pooled vector, before normalize

    @classmethod
    def from_dir(
        cls, model_dir: Path, default: PoolingConfig, allow_dense: bool = False
    ) -> PoolingConfig:
        """The directory's sentence-transformers pipeline, or `default` when it has none.

        Dense modules are read only with `allow_dense` (a runner that applies them); without
        it they are refused, never skipped."""
        modules_path = Path(model_dir) / "modules.json"
        if not modules_path.is_file():
            return default
        mode, normalize, pooled = default.mode, False, False
        dense: list[DenseConfig] = []
        supported = (
            "Transformer, Pooling, Dense, Normalize"
            if allow_dense
            else "Transformer, Pooling, Normalize"
        )
        for module in json.loads(modules_path.read_text()):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                config = json.loads((Path(model_dir) / module["path"] / "config.json").read_text())
                mode, pooled = _st_mode(config), True
            elif kind == "Normalize":
                normalize = True
            elif kind == "Dense" and allow_dense:
                if not pooled or normalize:
                    raise UnsupportedModelError(
                        "a sentence-transformers Dense module is "
                        "supported only between Pooling and Normalize"
                    )
                dense.append(DenseConfig.from_dir(Path(model_dir), module["path"]))
            elif kind != "Transformer":
                raise UnsupportedModelError(
                    f"sentence-transformers module {module.get('type')!r}"
                    f" is not supported ({supported})"
                )
        return cls(mode, normalize, tuple(dense))


class DenseHead(Module):
    """sentence-transformers' Dense: `activation(linear(x))`, plus the input (projected when
    the sizes differ) with `use_residual`. Parameter names are those of its checkpoint."""

    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.linear = nn.Linear(cfg.in_features, cfg.out_features, bias=cfg.bias)
        self.activation_function = DENSE_ACTIVATIONS[cfg.activation]()
        if cfg.residual and cfg.in_features != cfg.out_features:
            self.residual = nn.Linear(cfg.in_features, cfg.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        if self.cfg.residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def load_dense_heads(
    model_dir: Path, configs: tuple[DenseConfig, ...], in_features: int, device: torch.device
) -> nn.Sequential | None:
    """The Dense modules with their weights (float32, as the pooled vectors are), or None."""
    if not configs:
        return None
    heads = []
    for cfg in configs:
        if cfg.in_features != in_features:
            raise UnsupportedModelError(
                f"Dense module {cfg.path!r} takes {cfg.in_features} "
                f"features, the vector before it has {in_features}"
            )
        head = DenseHead(cfg)
        state = _dense_weights(Path(model_dir) / cfg.path)
        missing, unexpected = head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"Dense module {cfg.path!r}: missing weights {missing}, unexpected {unexpected}"
            )
        heads.append(head)
        in_features = cfg.out_features
    return nn.Sequential(*heads).to(device=device, dtype=torch.float32).eval()


def _dense_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():  # older saves; tensors only, no pickled code
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def _st_mode(config: dict[str, Any]) -> str:
    if isinstance(config.get("pooling_mode"), str):
        name = config["pooling_mode"]
        if name not in _ST_NAMES:
            raise UnsupportedModelError(f"pooling mode {name!r} is not supported")
        return _ST_NAMES[name]
    on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if len(on) != 1 or on[0] not in _ST_FLAGS:
        raise UnsupportedModelError(
            f"pooling {on or 'none'} is not supported; one of {', '.join(_ST_FLAGS)}"
        )
    return _ST_FLAGS[on[0]]


@dataclass
class EmbedItem:
    request_id: str
    token_ids: list[int]
    normalize: bool | None = None  # None: as the model's pooling config says
    dimensions: int = 0  # 0: the model's full size; else keep the first `dimensions` values
    type_start: int = 0  # a text pair: its second text's first token (token type 1); 0: one text


def pool(hidden: torch.Tensor, seq_lens: list[int], mode: str) -> torch.Tensor:
    """Flat hidden states [T, H] of consecutive sequences -> one float32 vector each [S, H]."""
    lens = torch.tensor(seq_lens, device=hidden.device)
    ends = lens.cumsum(0)
    if mode == "cls":
        return hidden[ends - lens].float()
    if mode == "last":
        return hidden[ends - 1].float()
    if mode == "mean":
        seq_of_row = torch.repeat_interleave(
            torch.arange(len(seq_lens), device=hidden.device), lens
        )
        sums = hidden.new_zeros(len(seq_lens), hidden.shape[1], dtype=torch.float32)
        return sums.index_add_(0, seq_of_row, hidden.float()) / lens.unsqueeze(1)
    raise ValueError(f"unknown pooling mode {mode!r} ({', '.join(POOLING_MODES)})")


def finish(
    pooled: torch.Tensor, items: list[EmbedItem], default_normalize: bool
) -> list[list[float]]:
    """Matryoshka truncation first, then normalization, so a truncated vector is unit length."""
    out: list[list[float]] = []
    for vector, item in zip(pooled.float().cpu(), items, strict=True):
        if item.dimensions:
            vector = vector[: item.dimensions]
        normalize = default_normalize if item.normalize is None else item.normalize
        if normalize:
            vector = F.normalize(vector, dim=-1)
        out.append(vector.tolist())
    return out


def check_item(
    item: EmbedItem, vocab_size: int, max_len: int, size: int, pairs: bool = False
) -> str | None:
    """Why this item cannot be embedded, or None; `pairs`: the model takes text pairs."""
    if not item.token_ids:
        return "an embedding input needs at least one token"
    if item.type_start and not pairs:
        return "this model takes single texts, not text pairs"
    if not 0 <= item.type_start < len(item.token_ids):
        return f"type_start {item.type_start} is outside the input's {len(item.token_ids)} tokens"
    if len(item.token_ids) > max_len:
        return f"{len(item.token_ids)} tokens exceed max_model_len {max_len}"
    if min(item.token_ids) < 0 or max(item.token_ids) >= vocab_size:
        return f"token id outside the vocabulary [0, {vocab_size})"
    if not 0 <= item.dimensions <= size:
        return f"dimensions must be in [1, {size}], got {item.dimensions}"
    return None


def flat_inputs(
    items: list[EmbedItem],
    vocab_size: int,
    max_len: int,
    size: int,
    device: torch.device,
    pairs: bool = False,
) -> tuple[list[int], torch.Tensor]:
    """Validates a batch of embedding inputs; returns their lengths and one flat id tensor."""
    for item in items:
        if error := check_item(item, vocab_size, max_len, size, pairs):
            raise ValueError(f"request {item.request_id}: {error}")
    lens = [len(item.token_ids) for item in items]
    ids = torch.tensor([t for item in items for t in item.token_ids], device=device)
    return lens, ids


def token_types(items: list[EmbedItem], device: torch.device) -> torch.Tensor | None:
    """The flat token types of a batch of text pairs (0 up to each `type_start`, 1 from it);
    None when no item is a pair (every token of type 0, the single-text path)."""
    if not any(item.type_start for item in items):
        return None
    kinds = [
        int(bool(item.type_start) and i >= item.type_start)
        for item in items
        for i in range(len(item.token_ids))
    ]
    return torch.tensor(kinds, device=device)
