"""The generated default model: deterministic, atomic, a normal HF directory transformers loads."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from kvledger import models
from kvledger.models import (
    TINY_LLAMA_RECIPE,
    embedding_model_path,
    resolve_model,
    tiny_llama_path,
    write_tiny_llama,
)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    """Two generations give the same bytes (its speed, ~0.5 s, is not a test's business)."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    write_tiny_llama(first)
    write_tiny_llama(second)
    names = sorted(p.name for p in first.iterdir())
    assert names == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_resolve_creates_once_in_a_versioned_cache_dir(
    kv_cache_dir: Path, tiny_llama_dir: Path
) -> None:
    assert tiny_llama_dir == tiny_llama_path() == kv_cache_dir / "tiny-llama-v2"
    stamp = (tiny_llama_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-llama") == tiny_llama_dir
    assert (tiny_llama_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in kv_cache_dir.iterdir() if p.name.startswith(".")]  # no temp dirs


def test_concurrent_first_use_is_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CACHE_DIR", str(tmp_path))
    results: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(models.ensure_tiny_llama())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-llama-v2"]
    assert json.loads((results[0] / "config.json").read_text())["hidden_size"] == 256


def test_config_is_the_recipe(tiny_llama_dir: Path) -> None:
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    ) == (256, 4, 8, 2)
    assert config["vocab_size"] == 30522 == TINY_LLAMA_RECIPE.vocab_size
    assert config["max_position_embeddings"] == 2048
    assert config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (101, 102)  # [CLS], [SEP]


def test_tokenizer_adds_only_bos(tiny_llama_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    ids = raw.encode("Hello world").ids
    assert ids[0] == 101 and 102 not in ids and 0 not in ids  # no [SEP], no padding
    assert len(raw.encode("word " * 300).ids) == 301  # no truncation at 128
    hf = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert hf("Hello world")["input_ids"] == ids
    assert (hf.bos_token_id, hf.eos_token_id) == (101, 102)


def test_transformers_loads_it(tiny_llama_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert abs(float(weight.detach().std()) - 0.02) < 0.002
    assert torch.equal(model.model.norm.weight, torch.ones(256))


def test_resolve_model_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()
    assert resolve_model("all-MiniLM-L6-v2") == embedding_model_path()
    assert (embedding_model_path() / "model.safetensors").is_file()


def test_cache_dir_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVLEDGER_CACHE_DIR", raising=False)
    assert models.cache_dir() == Path.home() / ".cache" / "kvledger"
