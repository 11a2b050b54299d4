"""BERT checkpoints whose encoder tensors carry a `bert.` prefix (saved from BertForMaskedLM,
BertForPreTraining, or a BertModel inside a wrapper) embed like transformers' BertModel loaded
from the same directory; the heads (`cls.*`) are skipped, anything else unknown is an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.worker.helpers import random_tokens
from worker.runner.base import load_runner
from worker.runner.config import RunnerConfig
from worker.runner.embedding_runner import EmbeddingRunner
from worker.runner.pooling import EmbedItem

BERT = dict(
    vocab_size=100,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)
PROMPTS = [random_tokens(n, 100, seed=n) for n in (1, 7, 33, 64)]


def save_bert(out: Path, cls_name: str) -> Path:
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(transformers.BertConfig(**BERT)).eval()
    with torch.no_grad():  # HF initializes biases at 0 and LayerNorms at 1
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.05)
            elif "LayerNorm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.save_pretrained(out)
    return out


def hf_cls_vectors(path: Path) -> torch.Tensor:
    from transformers import BertModel

    model = BertModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.stack([model(torch.tensor([p])).last_hidden_state[0, 0] for p in PROMPTS])


def embed(path: Path) -> torch.Tensor:
    runner = load_runner(RunnerConfig(path, progress=False))
    assert isinstance(runner, EmbeddingRunner)  # CLS pooling: no sentence-transformers config
    items = [EmbedItem(str(i), p, normalize=False) for i, p in enumerate(PROMPTS)]
    return torch.tensor(runner.embed(items))


@pytest.mark.parametrize("cls_name", ["BertForMaskedLM", "BertForPreTraining"])
def test_pretraining_heads_checkpoint_embeds_like_bert_model(tmp_path: Path, cls_name: str) -> None:
    path = save_bert(tmp_path, cls_name)
    names = load_file(path / "model.safetensors")
    assert all(n.startswith(("bert.", "cls.")) for n in names)
    assert any(n.startswith("cls.") for n in names)
    torch.testing.assert_close(embed(path), hf_cls_vectors(path), atol=1e-5, rtol=0)


def test_bert_model_saved_under_a_wrapper(tmp_path: Path) -> None:
    src = save_bert(tmp_path / "plain", "BertModel")
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    (wrapped / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    save_file({f"bert.{n}": t for n, t in tensors.items()}, wrapped / "model.safetensors")
    expected = hf_cls_vectors(src)
    torch.testing.assert_close(embed(wrapped), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(embed(src), expected, atol=1e-5, rtol=0)  # unprefixed: as before


def test_unknown_tensors_beside_the_prefix_are_named(tmp_path: Path) -> None:
    path = save_bert(tmp_path, "BertForMaskedLM")
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, "classifier.weight": torch.zeros(2, 48)}, path / "model.safetensors")
    with pytest.raises(ValueError, match="does not know: classifier.weight"):
        embed(path)


def test_other_heads_are_still_refused(tmp_path: Path) -> None:
    path = save_bert(tmp_path, "BertForMaskedLM")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["BertForTokenClassification"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture BertForTokenClassification"):
        embed(path)
    # a sequence classifier is served (a cross-encoder), but not from a checkpoint without
    # its classifier: the masked-LM head's tensors are named, never skipped
    config["architectures"] = ["BertForSequenceClassification"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not know: cls.predictions"):
        embed(path)
