"""Random-weight cross-encoders made at test time, in sentence-transformers' `CrossEncoder`
layout: transformers' own `BertForSequenceClassification` saved with `save_pretrained`, and the
tokenizer of the packaged all-MiniLM-L6-v2 (its vocabulary is the model's).

The weights are drawn wider than transformers' default (`initializer_range`) so that the
scores of different pairs are far apart: an ordering test never hangs on a last digit. The
tokenizer's `model_max_length` is cut to `MAX_LENGTH` so that a few words of text reach the
truncation `CrossEncoder` applies (and the model's positions stay small)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from kvledger.models import embedding_model_path

MAX_LENGTH = 48
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "special_tokens_map.json")


def make_cross_encoder(target: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """Writes the model into `target` (made whole in a sibling directory, then renamed, so a
    reader never sees half of it) and returns `target`; an existing `target` is kept."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    target = Path(target)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
        initializer_range=0.3,
    )
    BertForSequenceClassification(config).eval().save_pretrained(tmp)
    source = embedding_model_path()
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, tmp / name)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = MAX_LENGTH
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


def session_cross_encoder_path() -> Path:
    """Where this test process keeps its served cross-encoder: known before any fixture runs
    (a stack's flags name it at import), private to the process (another run's is its own)."""
    return Path(tempfile.gettempdir()) / f"kvledger-test-cross-encoder-{os.getpid()}"
