"""Embeddings: our BERT equals sentence-transformers on the packaged all-MiniLM-L6-v2; pooling
config, Matryoshka dimensions, decoder last-token pooling, and the executor's embedding path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kvledger.models import embedding_model_path
from protos import worker_pb2
from tests.worker.helpers import random_tokens, wire_step
from worker.config import UnsupportedModelError
from worker.executor import Executor
from worker.runner.base import load_runner
from worker.runner.config import RunnerConfig
from worker.runner.embedding_runner import EmbeddingRunner
from worker.runner.model_runner import ModelRunner
from worker.runner.pooling import EmbedItem, PoolingConfig, pool

SENTENCES = [
    "Hello world",
    "x",
    "The scheduler keeps an exact ledger of every block in the KV cache.",
    "A block whose content was evicted and reused must never be read as a cached prefix, "
    "because users would see repeated characters and gibberish under high concurrency.",
    " ".join(f"word{i}" for i in range(150)),  # longer than 128 tokens (the tokenizer's pad)
    "Ünïcödé and punctuation!? ... (yes) — dashes",
]
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def minilm() -> EmbeddingRunner:
    runner = load_runner(RunnerConfig(embedding_model_path(), progress=False))
    assert isinstance(runner, EmbeddingRunner)
    return runner


@pytest.fixture(scope="module")
def token_ids() -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(embedding_model_path() / "tokenizer.json"))
    tok.no_padding()  # the packaged tokenizer pads every input to 128
    tok.enable_truncation(256)  # sentence-transformers' max_seq_length
    return [tok.encode(s).ids for s in SENTENCES]


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(embedding_model_path()), device="cpu")
    return model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False).float()


def items(ids: list[list[int]], **kw) -> list[EmbedItem]:
    return [EmbedItem(str(i), t, **kw) for i, t in enumerate(ids)]


def test_registration_facts(minilm: EmbeddingRunner) -> None:
    assert minilm.kind == "embed"
    assert minilm.pooling == PoolingConfig("mean", True)
    assert (minilm.num_blocks, minilm.max_model_len, minilm.vocab_size) == (0, 256, 30522)
    assert minilm.embedding_size == 384


def test_matches_sentence_transformers_batched_and_alone(
    minilm: EmbeddingRunner, token_ids: list[list[int]], reference: torch.Tensor
) -> None:
    assert len(token_ids[4]) > 128
    batched = torch.tensor(minilm.embed(items(token_ids)))
    alone = torch.tensor([minilm.embed(items([t]))[0] for t in token_ids])
    for ours in (batched, alone):
        cosine = F.cosine_similarity(ours, reference)
        assert cosine.min().item() >= MIN_COSINE, cosine
        torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(SENTENCES)))


def test_dimensions_truncate_then_renormalize(
    minilm: EmbeddingRunner, token_ids: list[list[int]], reference: torch.Tensor
) -> None:
    got = torch.tensor(minilm.embed(items(token_ids, dimensions=64)))
    assert got.shape == (len(SENTENCES), 64)
    expected = F.normalize(reference[:, :64], dim=1)
    assert F.cosine_similarity(got, expected).min().item() >= MIN_COSINE
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(SENTENCES)))


def test_normalize_off_returns_the_pooled_vector(
    minilm: EmbeddingRunner, token_ids: list[list[int]]
) -> None:
    raw = torch.tensor(minilm.embed(items(token_ids[:2], normalize=False, dimensions=8)))
    full = torch.tensor(minilm.embed(items(token_ids[:2], normalize=False)))
    assert (full.norm(dim=1) - 1).abs().min().item() > 0.1  # mean pooling is not unit length
    torch.testing.assert_close(raw, full[:, :8])


def test_pooling_modes() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)  # sequences of 2, 3 and 1 rows
    lens = [2, 3, 1]
    assert pool(hidden, lens, "cls").tolist() == [[0, 1], [4, 5], [10, 11]]
    assert pool(hidden, lens, "last").tolist() == [[2, 3], [8, 9], [10, 11]]
    assert pool(hidden, lens, "mean").tolist() == [[1, 2], [6, 7], [10, 11]]


def st_dir(tmp_path: Path, pooling: dict, extra: list[dict] | None = None) -> Path:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ] + (extra or [])
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def test_pooling_config_from_sentence_transformers(tmp_path: Path) -> None:
    default = PoolingConfig("cls", True)
    assert PoolingConfig.from_dir(tmp_path, default) == default  # no modules.json
    cls_dir = st_dir(
        tmp_path / "a", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    )
    assert PoolingConfig.from_dir(cls_dir, default) == PoolingConfig("cls", False)
    last = st_dir(
        tmp_path / "b",
        {"pooling_mode_lasttoken": True},
        [
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        ],
    )
    assert PoolingConfig.from_dir(last, default) == PoolingConfig("last", True)
    named = st_dir(tmp_path / "c", {"pooling_mode": "mean"})
    assert PoolingConfig.from_dir(named, default).mode == "mean"


@pytest.mark.parametrize(
    ("pooling", "extra", "message"),
    [
        ({"pooling_mode_max_tokens": True}, None, "pooling_mode_max_tokens"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, None, "not supported"),
        (
            {"pooling_mode_mean_tokens": True},
            [
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense",
                }
            ],
            "Dense",
        ),
    ],
)
def test_pooling_config_refuses_clearly(
    tmp_path: Path, pooling: dict, extra: list | None, message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        PoolingConfig.from_dir(st_dir(tmp_path, pooling, extra), PoolingConfig("cls", True))


@pytest.mark.parametrize("name", ["llama", "mistral_window"])
def test_decoder_embeds_with_last_token_pooling(hf_checkpoint, name: str) -> None:
    from transformers import AutoModel

    path = hf_checkpoint(name)
    runner = load_runner(RunnerConfig(path, num_blocks=8, progress=False))
    assert isinstance(runner, ModelRunner)
    assert runner.kind == "generate" and runner.pooling == PoolingConfig("last", True)
    prompts = [random_tokens(n, 256, seed=n) for n in (5, 30, 17)]  # 30 > mistral's window 12
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.stack([hf(torch.tensor([p])).last_hidden_state[0, -1] for p in prompts])
    got = torch.tensor(runner.embed(items(prompts, normalize=False)))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    unit = torch.tensor(runner.embed(items(prompts)))
    torch.testing.assert_close(unit, F.normalize(expected, dim=1), atol=1e-5, rtol=0)


# ---- the executor's embedding path ------------------------------------------------------


def embed_request(
    rid: str, tokens: list[int], dimensions: int = 0, scheduled: int | None = None
) -> worker_pb2.NewRequest:
    return worker_pb2.NewRequest(
        request_id=rid,
        token_ids=tokens,
        num_computed_tokens=0,
        num_scheduled_tokens=len(tokens) if scheduled is None else scheduled,
        num_prompt_tokens=len(tokens),
        embed=worker_pb2.EmbedParams(normalize=True, dimensions=dimensions),
    )


def test_executor_returns_embeddings_and_per_request_errors(
    minilm: EmbeddingRunner, token_ids: list[list[int]], reference: torch.Tensor
) -> None:
    ex = Executor(minilm)
    plan = worker_pb2.Plan(
        step_id=3,
        new_requests=[
            embed_request("a", token_ids[2]),
            embed_request("bad-token", [101, 30522, 102]),
            embed_request("b", token_ids[0], dimensions=32),
            embed_request("too-long", [101] * 257),
            embed_request("dims", token_ids[1], dimensions=385),
            embed_request("split", token_ids[3], scheduled=4),
            worker_pb2.NewRequest(
                request_id="gen", token_ids=[101, 7592], num_scheduled_tokens=2, num_prompt_tokens=2
            ),
        ],
    )
    result = wire_step(ex, plan)
    got = {e.request_id: torch.tensor(list(e.values)) for e in result.embeddings}
    assert sorted(got) == ["a", "b"]
    assert F.cosine_similarity(got["a"], reference[2], dim=0).item() >= MIN_COSINE
    assert got["b"].shape == (32,)
    errors = {e.request_id: e.message for e in result.errors}
    assert "vocabulary" in errors["bad-token"]
    assert "max_model_len" in errors["too-long"]
    assert "dimensions" in errors["dims"]
    assert "whole" in errors["split"]
    assert "only computes embeddings" in errors["gen"]
    assert not result.sampled and ex.seqs == {}
