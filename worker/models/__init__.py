"""Model definitions, chosen by the `architectures` entry of config.json."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from worker.attention.base import AttentionBackend
from worker.config import EncoderConfig, ModelConfig
from worker.models.bert import BertForSequenceClassification, BertModel
from worker.models.llama import LlamaForCausalLM
from worker.parallel.distributed import TPGroup

# Mistral and Qwen2 are Llama with a sliding window or a q/k/v bias, both read from the config.
MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}
# Checkpoints with a pretraining head load their `bert.` encoder; the head is skipped. A
# sequence classifier (a cross-encoder) keeps its pooler and classifier.
ENCODER_CLASSES: dict[str, type[BertModel | BertForSequenceClassification]] = {
    "BertModel": BertModel,
    "BertForMaskedLM": BertModel,
    "BertForPreTraining": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
}

M = TypeVar("M", bound=nn.Module)


def build_model(
    cfg: ModelConfig,
    backend: AttentionBackend,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    tp: TPGroup | None = None,
) -> LlamaForCausalLM:
    """Uninitialized parameters of `dtype` on `device`; the loader fills them. In a
    tensor-parallel group, this rank's shard of them."""
    cls = MODEL_CLASSES[cfg.architecture]
    return _build(lambda: cls(cfg, backend, max_positions, dtype, tp), dtype, device)


def build_encoder(
    cfg: EncoderConfig, dtype: torch.dtype, device: torch.device
) -> BertModel | BertForSequenceClassification:
    cls = ENCODER_CLASSES[cfg.architecture]
    return _build(lambda: cls(cfg), dtype, device)


def _build(make: Callable[[], M], dtype: torch.dtype, device: torch.device) -> M:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = make()
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
