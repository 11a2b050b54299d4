"""Our paged Llama-family forward pass equals Hugging Face transformers (fp32, atol 1e-4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.worker.helpers import (
    ATOL,
    CONFIGS,
    full_logits,
    greedy,
    hf_greedy,
    hf_logits,
    hf_model,
    make_runner,
    random_tokens,
)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(hf_checkpoint, name: str) -> None:
    path = hf_checkpoint(name)
    tokens = random_tokens(40, 256, seed=1)
    ours = full_logits(make_runner(path), tokens)
    torch.testing.assert_close(ours, hf_logits(hf_model(path), tokens), atol=ATOL, rtol=0)


def test_old_rope_spelling_reads_the_same(hf_checkpoint, tmp_path: Path) -> None:
    """transformers 5 writes `rope_parameters`; published checkpoints carry the old keys."""
    src = hf_checkpoint("llama3_rope")
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    tokens = random_tokens(40, 256, seed=2)
    torch.testing.assert_close(
        full_logits(make_runner(tmp_path), tokens),
        full_logits(make_runner(src), tokens),
        atol=0,
        rtol=0,
    )


@pytest.mark.parametrize("name", ["llama", "mistral_window", "qwen2"])
def test_greedy_generation_matches_generate(hf_checkpoint, name: str) -> None:
    path = hf_checkpoint(name)
    prompt = random_tokens(9, 256, seed=3)
    runner = make_runner(path, block_size=8)
    assert greedy(runner, prompt, 64) == hf_greedy(hf_model(path), prompt, 64)


def test_tiny_llama_matches_transformers(tiny_llama_dir: Path) -> None:
    model = hf_model(tiny_llama_dir)
    runner = make_runner(tiny_llama_dir)
    tokens = [101, *random_tokens(30, 30522, seed=4)]
    torch.testing.assert_close(
        full_logits(runner, tokens), hf_logits(model, tokens), atol=ATOL, rtol=0
    )
    prompt = [101, 7592, 1010, 2088]
    assert greedy(runner, prompt, 32) == hf_greedy(model, prompt, 32)
