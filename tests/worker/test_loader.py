"""Weight loading: sharded checkpoints, and clear errors for missing or unknown tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.worker.helpers import full_logits, make_runner, random_tokens


def copy_config(src: Path, dst: Path) -> Path:
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


def test_sharded_checkpoint_with_index(hf_checkpoint, tmp_path: Path) -> None:
    src = hf_checkpoint("llama")
    dst = copy_config(src, tmp_path / "sharded")
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, dst / file)
        weight_map.update(dict.fromkeys(part, file))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    # a stray duplicate set, as some repositories ship: the index decides what is read
    save_file({"junk": torch.zeros(1)}, dst / "consolidated.safetensors")
    tokens = random_tokens(20, 256, seed=0)
    torch.testing.assert_close(
        full_logits(make_runner(dst), tokens), full_logits(make_runner(src), tokens), atol=0, rtol=0
    )


def test_missing_and_unknown_tensors_are_named(hf_checkpoint, tmp_path: Path) -> None:
    src = hf_checkpoint("llama")
    tensors = load_file(src / "model.safetensors")
    missing = copy_config(src, tmp_path / "missing")
    save_file(
        {n: t for n, t in tensors.items() if "layers.1.self_attn.k_proj" not in n},
        missing / "model.safetensors",
    )
    with pytest.raises(ValueError, match=r"lacks weights for: model\.layers\.1\.self_attn\.qkv"):
        make_runner(missing)
    extra = copy_config(src, tmp_path / "extra")
    save_file(
        {**tensors, "model.layers.0.mystery.weight": torch.zeros(2)}, extra / "model.safetensors"
    )
    with pytest.raises(ValueError, match="does not know: model.layers.0.mystery.weight"):
        make_runner(extra)


def test_shape_mismatch_is_an_error(hf_checkpoint, tmp_path: Path) -> None:
    src = hf_checkpoint("llama")
    tensors = load_file(src / "model.safetensors")
    bad = copy_config(src, tmp_path / "bad")
    tensors["model.norm.weight"] = torch.ones(63)
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(63,\)"):
        make_runner(bad)
