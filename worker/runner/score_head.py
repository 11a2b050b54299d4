"""A cross-encoder's scores as sentence-transformers' `CrossEncoder.predict` returns them.

The rule (sentence-transformers 6.3.0, the version the tests compare against): the classifier's
logits go through the model's activation, and nothing else (no softmax: `predict`'s
`apply_softmax` is off by default). The activation is, first found:

1. `activation_fn` of `config_sentence_transformers.json` (what `CrossEncoder.save` writes),
2. `sentence_transformers.activation_fn` of `config.json`,
3. `sbert_ce_default_activation_function` of `config.json` (checkpoints before version 4),
4. else Sigmoid for one label, Identity for more.

A name outside `torch.` is code sentence-transformers runs only with `trust_remote_code`;
without it, one in 1 passes on to 2, one in 2 or 3 means the default, and so it does here.
A `torch.` activation not in `DENSE_ACTIVATIONS` is refused, never replaced by another. Pairs
are truncated to the tokenizer's `model_max_length` (`CrossEncoder`'s `max_seq_length`) when
no `sentence_bert_config.json` says otherwise (`max_length_default`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from worker.config import UnsupportedModelError
from worker.runner.pooling import DENSE_ACTIVATIONS

MAX_LABELS = 1 << 16  # the scheduler's bound on a registration's embedding size
_ST_CONFIG = "config_sentence_transformers.json"


@dataclass(frozen=True)
class ScoreHead:
    """How many scores a pair gets, and the activation on the logits (a DENSE_ACTIVATIONS key)."""

    num_labels: int
    activation: str

    @classmethod
    def from_dir(cls, model_dir: Path, num_labels: int) -> ScoreHead:
        if not 1 <= num_labels <= MAX_LABELS:
            raise UnsupportedModelError(f"num_labels {num_labels} must be in [1, {MAX_LABELS}]")
        _check_modules(Path(model_dir))
        name = _activation_name(Path(model_dir))
        if name is None:
            return cls(num_labels, "Sigmoid" if num_labels == 1 else "Identity")
        short = name.rsplit(".", 1)[-1]
        if short not in DENSE_ACTIVATIONS:
            raise UnsupportedModelError(
                f"cross-encoder activation {name!r} is not supported "
                f"({', '.join(DENSE_ACTIVATIONS)})"
            )
        return cls(num_labels, short)

    def module(self) -> nn.Module:
        return DENSE_ACTIVATIONS[self.activation]()

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[S, num_labels] logits -> the scores `predict` returns, in float32."""
        return self.module()(logits.float())


def _activation_name(model_dir: Path) -> str | None:
    """The `torch.` activation the directory names, in sentence-transformers' order of
    lookup, or None for the default. An untrusted name in the first source passes on to the
    next; one in `config.json` means the default, as it does there."""
    name = _json(model_dir / _ST_CONFIG).get("activation_fn")
    if name and _trusted(str(name)):
        return str(name)
    config = _json(model_dir / "config.json")
    nested = config.get("sentence_transformers")
    if isinstance(nested, dict) and "activation_fn" in nested:
        name = nested["activation_fn"]
    else:
        name = config.get("sbert_ce_default_activation_function")
    return str(name) if name and _trusted(str(name)) else None


def _trusted(name: str) -> bool:
    return name.startswith("torch.")


def _check_modules(model_dir: Path) -> None:
    """A sentence-transformers pipeline of a cross-encoder is its Transformer alone; modules
    after it (a Dense on the scores) are refused, never skipped."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return
    for module in json.loads(path.read_text()):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind != "Transformer":
            raise UnsupportedModelError(
                f"cross-encoder module {module.get('type')!r} is not supported (Transformer only)"
            )


def max_length_default(model_dir: Path) -> int | None:
    """The tokenizer's `model_max_length` (what `CrossEncoder` truncates pairs to), or None."""
    value = _json(Path(model_dir) / "tokenizer_config.json").get("model_max_length")
    return int(value) if isinstance(value, int | float) and 0 < value < 1 << 31 else None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}
