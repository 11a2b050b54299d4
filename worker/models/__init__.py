"""Model definitions, chosen by the `architectures` entry of config.json."""

from __future__ import annotations

import torch

from worker.attention.base import AttentionBackend
from worker.config import ModelConfig
from worker.models.llama import LlamaForCausalLM

# Mistral and Qwen2 are Llama with a sliding window or a q/k/v bias, both read from the config.
MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


def build_model(cfg: ModelConfig, backend: AttentionBackend, max_positions: int,
                dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """Uninitialized parameters of `dtype` on `device`; the loader fills them."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MODEL_CLASSES[cfg.architecture](cfg, backend, max_positions, dtype)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
