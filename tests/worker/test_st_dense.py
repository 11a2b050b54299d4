"""sentence-transformers Dense modules after Pooling: our embeddings equal sentence-transformers'
own on a tiny BERT + Pooling + Dense (+ Normalize) pipeline that it saved itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from kvledger.models import embedding_model_path
from worker.config import UnsupportedModelError
from worker.runner.base import load_runner
from worker.runner.config import RunnerConfig
from worker.runner.embedding_runner import EmbeddingRunner
from worker.runner.pooling import DenseConfig, EmbedItem, PoolingConfig

SENTENCES = ["Hello world", "x", "A longer sentence about blocks, hashes and the ledger."]
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
HIDDEN = 32


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer BERT with the packaged all-MiniLM-L6-v2 tokenizer (vocab 30522)."""
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(embedding_model_path() / name, out / name)
    return out


def st_pipeline(tiny_bert: Path, out: Path, dense: list[nn.Module], normalize: bool) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    torch.manual_seed(1)
    modules = [Transformer(str(tiny_bert), max_seq_length=64), Pooling(HIDDEN, "mean"), *dense]
    model = SentenceTransformer(
        modules=[*modules, *([Normalize()] if normalize else [])], device="cpu"
    )
    with torch.no_grad():  # Dense biases start at 0 in some versions: make them count
        for name, param in model.named_parameters():
            if "linear.bias" in name:
                param.normal_(0.0, 0.1)
    model.save(str(out))
    return out


def dense(in_features: int, out_features: int, **kw) -> nn.Module:
    from sentence_transformers.sentence_transformer.modules import Dense

    return Dense(in_features, out_features, **kw)


CASES = {
    "tanh_normalize": (lambda: [dense(HIDDEN, 16)], True),
    "chained_residual": (
        lambda: [
            dense(HIDDEN, 24, activation_function=nn.GELU(), use_residual=True),
            dense(24, 24, bias=False, activation_function=None, use_residual=True),
            dense(24, 8, activation_function=nn.ReLU()),
        ],
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_matches_sentence_transformers(tiny_bert: Path, tmp_path: Path, case: str) -> None:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    make, normalize = CASES[case]
    path = st_pipeline(tiny_bert, tmp_path / case, make(), normalize)
    modules = json.loads((path / "modules.json").read_text())
    assert any(m["type"].endswith("Dense") for m in modules)
    reference = (
        SentenceTransformer(str(path), device="cpu")
        .encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False)
        .float()
    )

    runner = load_runner(RunnerConfig(path, progress=False))
    assert isinstance(runner, EmbeddingRunner)
    assert runner.embedding_size == reference.shape[1] == runner.pooling.dense[-1].out_features
    assert runner.pooling.normalize is normalize
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_padding()
    ids = [tok.encode(s).ids for s in SENTENCES]
    got = torch.tensor(runner.embed([EmbedItem(str(i), t) for i, t in enumerate(ids)]))
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    # Matryoshka `dimensions` apply to the projected vector
    short = torch.tensor(runner.embed([EmbedItem("0", ids[2], normalize=False, dimensions=4)]))
    raw = torch.tensor(runner.embed([EmbedItem("0", ids[2], normalize=False)]))
    torch.testing.assert_close(short, raw[:, :4])


def test_dense_weights_in_pytorch_model_bin(tiny_bert: Path, tmp_path: Path) -> None:
    """Older sentence-transformers saves: the Dense weights in 2_Dense/pytorch_model.bin."""
    from safetensors.torch import load_file

    path = st_pipeline(tiny_bert, tmp_path / "bin", [dense(HIDDEN, 16)], True)
    ids = [[101, 7592, 2088, 102]]
    before = load_runner(RunnerConfig(path, progress=False)).embed([EmbedItem("0", ids[0])])
    folder = path / "2_Dense"
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    after = load_runner(RunnerConfig(path, progress=False)).embed([EmbedItem("0", ids[0])])
    assert after == before
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match="2_Dense"):
        load_runner(RunnerConfig(path, progress=False))


def write_modules(path: Path, kinds: list[str], dense_config: dict | None = None) -> Path:
    path.mkdir()
    modules = [
        {
            "idx": i,
            "name": str(i),
            "path": f"{i}_{kind}" if i else "",
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(kinds)
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    for i, kind in enumerate(kinds):
        if kind == "Pooling":
            (path / f"{i}_Pooling").mkdir()
            (path / f"{i}_Pooling" / "config.json").write_text(
                json.dumps({"pooling_mode_mean_tokens": True})
            )
        if kind == "Dense":
            (path / f"{i}_Dense").mkdir()
            (path / f"{i}_Dense" / "config.json").write_text(
                json.dumps(dense_config or {"in_features": 8, "out_features": 4})
            )
    return path


def test_dense_config_defaults_and_decoders_still_refuse(tmp_path: Path) -> None:
    path = write_modules(tmp_path / "a", ["Transformer", "Pooling", "Dense", "Normalize"])
    default = PoolingConfig("cls", True)
    got = PoolingConfig.from_dir(path, default, allow_dense=True)
    assert got == PoolingConfig("mean", True, (DenseConfig("2_Dense", 8, 4),))
    assert got.dense[0].activation == "Tanh" and got.dense[0].bias  # sentence-transformers' own
    with pytest.raises(UnsupportedModelError, match="Dense"):  # e.g. a decoder's runner
        PoolingConfig.from_dir(path, default)


@pytest.mark.parametrize(
    ("kinds", "dense_config", "message"),
    [
        (["Transformer", "Dense", "Pooling"], None, "between Pooling and Normalize"),
        (["Transformer", "Pooling", "Normalize", "Dense"], None, "between Pooling and Normalize"),
        (
            ["Transformer", "Pooling", "Dense"],
            {"in_features": 8, "out_features": 4, "activation_function": "my_pkg.Swish"},
            "my_pkg",
        ),
        (
            ["Transformer", "Pooling", "Dense"],
            {"in_features": 8, "out_features": 4, "module_input_name": "token_embeddings"},
            "token_embeddings",
        ),
    ],
)
def test_dense_refuses_clearly(
    tmp_path: Path, kinds: list[str], dense_config: dict | None, message: str
) -> None:
    path = write_modules(tmp_path / "m", kinds, dense_config)
    with pytest.raises(UnsupportedModelError, match=message):
        PoolingConfig.from_dir(path, PoolingConfig("cls", True), allow_dense=True)
