"""/v1/embeddings end to end: the packaged all-MiniLM-L6-v2 served by its own worker equals
sentence-transformers, in both encodings the official client uses."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer

from kvledger.models import embedding_model_path
from tests.e2e.stacks import Stack

MODEL = "all-MiniLM-L6-v2"
SENTENCES = [
    "A ledger of blocks.",
    "The quick brown fox jumps over the lazy dog.",
    "東京の天気は晴れです 🎉",
    "word " * 200,
]


STACK = Stack(("--num-kv-blocks", "32"), embedding=True)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    model = SentenceTransformer(str(embedding_model_path()), device="cpu")
    return model.encode(SENTENCES, normalize_embeddings=True)


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_both_models_are_listed(client):
    assert sorted(m.id for m in client.models.list().data) == [MODEL, "tiny-llama"]


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_embeddings_match_sentence_transformers(client, reference, encoding_format):
    out = client.embeddings.create(model=MODEL, input=SENTENCES, encoding_format=encoding_format)
    assert [d.index for d in out.data] == list(range(len(SENTENCES)))
    for got, want in zip(out.data, reference, strict=True):
        vector = got.embedding
        if encoding_format == "base64":  # asked for explicitly, the client leaves it encoded
            vector = np.frombuffer(base64.b64decode(vector), dtype="<f4")
        assert len(vector) == 384
        assert cosine(vector, want) >= 0.9999
    assert out.usage.prompt_tokens > len(SENTENCES)


def test_default_client_encoding_and_single_input(client, reference):
    # The official client asks for base64 unless told otherwise, and decodes it itself.
    out = client.embeddings.create(model=MODEL, input=SENTENCES[1])
    assert cosine(out.data[0].embedding, reference[1]) >= 0.9999


def test_dimensions_truncate_and_renormalise(client, reference):
    out = client.embeddings.create(
        model=MODEL, input=SENTENCES[0], dimensions=64, encoding_format="float"
    )
    vec = np.asarray(out.data[0].embedding)
    assert vec.shape == (64,)
    assert abs(np.linalg.norm(vec) - 1) < 1e-5
    assert cosine(vec, reference[0][:64]) >= 0.9999


def test_embedding_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input="word " * 400)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input="x", dimensions=5000)


def test_a_decoder_embeds_with_last_token_pooling(client):
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaModel

    from kvledger.models import resolve_model

    path = resolve_model("tiny-llama")
    text = "The ledger is exact."
    ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids
    with torch.inference_mode():
        hidden = LlamaModel.from_pretrained(path, torch_dtype=torch.float32)(
            torch.tensor([ids])
        ).last_hidden_state[0, -1]
    want = torch.nn.functional.normalize(hidden, dim=0).numpy()
    out = client.embeddings.create(model="tiny-llama", input=text, encoding_format="float")
    assert len(out.data[0].embedding) == 256
    assert cosine(out.data[0].embedding, want) >= 0.9999
    again = client.embeddings.create(model="tiny-llama", input=[text, text + " twice"])
    assert cosine(again.data[0].embedding, want) >= 0.9999
