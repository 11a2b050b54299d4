"""Cross-encoders: the embedding runner's scores of text pairs equal sentence-transformers'
`CrossEncoder.predict` on random-weight `BertForSequenceClassification` checkpoints made here,
with the pairs tokenized by the frontend's pair tokenizer (truncation included); the
activation's lookup; the executor's refusal of a pair on a single-text model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from kvledger.config.frontend import Limits
from protos import frontend_pb2
from server.client import ServedModel
from server.scoring import score_pairs_inputs
from tests.cross_encoders import MAX_LENGTH, make_cross_encoder
from worker.config import UnsupportedModelError
from worker.runner.base import load_runner
from worker.runner.config import RunnerConfig
from worker.runner.embedding_runner import EmbeddingRunner
from worker.runner.pooling import EmbedItem, check_item
from worker.runner.score_head import ScoreHead

PAIRS = [
    ("what is a ledger", "a ledger is a book of accounts"),
    ("x", "y"),
    ("Ünïcödé query?", "東京の天気は晴れです 🎉"),
    ("hello " * 40, "world " * 30),  # both texts cut: longest first
    ("a b c", "z " * 100),  # the document alone is cut
    ("q " * 100, "d"),  # the query alone is cut
    ("an empty document", ""),
]
TOLERANCE = 1e-5


def served(path: Path, runner: EmbeddingRunner) -> ServedModel:
    """The frontend's view of the model, as its catalogue would build it."""
    info = frontend_pb2.ModelInfo(
        name="ce", model_path=str(path), max_model_len=runner.max_model_len, num_labels=1
    )
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return ServedModel(info, tokenizer)


def scores(path: Path, runner: EmbeddingRunner) -> torch.Tensor:
    limits = Limits()
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    inputs, _ = score_pairs_inputs(served(path, runner), firsts, seconds, "documents", limits)
    assert max(len(i.ids) for i in inputs) == MAX_LENGTH  # truncation was reached
    items = [EmbedItem(str(i), list(t.ids), False, 0, t.type_start) for i, t in enumerate(inputs)]
    return torch.tensor(runner.embed(items))


@pytest.mark.parametrize("num_labels", [1, 3])
def test_scores_equal_sentence_transformers(tmp_path: Path, num_labels: int) -> None:
    from sentence_transformers import CrossEncoder

    path = make_cross_encoder(tmp_path / "ce", num_labels=num_labels)
    runner = load_runner(RunnerConfig(path, progress=False))
    assert isinstance(runner, EmbeddingRunner)
    assert (runner.num_labels, runner.embedding_size) == (num_labels, num_labels)
    assert runner.max_model_len == MAX_LENGTH  # the tokenizer's model_max_length, as ST's
    want = torch.as_tensor(CrossEncoder(str(path), device="cpu").predict(PAIRS))
    got = scores(path, runner)
    got = got.squeeze(-1) if num_labels == 1 else got
    assert got.shape == want.shape
    assert torch.allclose(got, want.float(), atol=TOLERANCE, rtol=0), (got - want).abs().max()
    if num_labels == 1:  # a sigmoid: distinct probabilities, not saturated
        assert 0 < got.min() < got.max() < 1


def test_activation_lookup(tmp_path: Path) -> None:
    path = make_cross_encoder(tmp_path / "ce")
    assert ScoreHead.from_dir(path, 1) == ScoreHead(1, "Sigmoid")
    assert ScoreHead.from_dir(path, 2) == ScoreHead(2, "Identity")
    st_config = path / "config_sentence_transformers.json"
    st_config.write_text(json.dumps({"activation_fn": "torch.nn.modules.linear.Identity"}))
    assert ScoreHead.from_dir(path, 1).activation == "Identity"
    st_config.write_text(json.dumps({"activation_fn": "my_module.Scale"}))  # untrusted: default
    assert ScoreHead.from_dir(path, 1).activation == "Sigmoid"
    st_config.write_text(json.dumps({"activation_fn": "torch.nn.Softplus"}))
    with pytest.raises(UnsupportedModelError, match="Softplus"):
        ScoreHead.from_dir(path, 1)
    (path / "modules.json").write_text(json.dumps([{"type": "x.Transformer"}, {"type": "x.Dense"}]))
    with pytest.raises(UnsupportedModelError, match="Dense"):
        ScoreHead.from_dir(path, 1)


def test_pairs_only_where_the_model_takes_them() -> None:
    pair = EmbedItem("p", [101, 7, 102, 8, 102], False, 0, 3)
    assert check_item(pair, 1000, 64, 1, pairs=True) is None
    assert "text pairs" in (check_item(pair, 1000, 64, 384) or "")
    outside = EmbedItem("p", [101, 102], False, 0, 2)
    assert "outside" in (check_item(outside, 1000, 64, 1, pairs=True) or "")
