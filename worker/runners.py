"""Pick the runner a model directory needs: an encoder embeds, a decoder generates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker.config import is_encoder
from worker.embedding_runner import EmbeddingRunner
from worker.model_runner import ModelRunner


def load_runner(model_path: Path, **kwargs: Any) -> ModelRunner | EmbeddingRunner:
    """`kwargs` are ModelRunner's; `.kind` of the result is "generate" or "embed"."""
    runner_cls = EmbeddingRunner if is_encoder(Path(model_path)) else ModelRunner
    return runner_cls(Path(model_path), **kwargs)
