"""Rerank and score end to end: a random-weight cross-encoder made here, served by serve's
embedding worker (`--embedding-model`), scored as sentence-transformers' `CrossEncoder`
scores it; each route's shape (Jina's, Cohere's, vLLM's /score), `top_n`, `return_documents`,
the bounds and errors, Cohere's own client, and nothing left in the ledger afterwards."""

from __future__ import annotations

import shutil

import cohere
import pytest

from tests.cross_encoders import make_cross_encoder, session_cross_encoder_path
from tests.e2e.helpers import idle
from tests.e2e.stacks import Stack

CROSS_ENCODER = session_cross_encoder_path()
MODEL = str(CROSS_ENCODER)  # serve names the embedding worker's model by its --embedding-model
KEY = "key-rerank"
MAX_DOCUMENTS = 8
STACK = Stack(
    (
        "--num-kv-blocks", "16", "--api-key", KEY,
        "--embedding-model", MODEL, "--max-rerank-documents", str(MAX_DOCUMENTS),
    ),
    embedding=True,
)  # fmt: skip
QUERY = "what is a ledger"
DOCUMENTS = [
    "a ledger is a book of accounts",
    "x",
    "hello world",
    "z " * 100,  # truncated to the model's length
    "東京の天気は晴れです 🎉",
]


@pytest.fixture(scope="module", autouse=True)
def cross_encoder():
    """Made before the stack starts (autouse runs first), removed when the module ends."""
    yield make_cross_encoder(CROSS_ENCODER)
    shutil.rmtree(CROSS_ENCODER, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(cross_encoder) -> list[float]:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(cross_encoder), device="cpu")
    return [float(s) for s in model.predict([(QUERY, d) for d in DOCUMENTS])]


def ranked(reference: list[float]) -> list[int]:
    return sorted(range(len(reference)), key=lambda i: -reference[i])


def post(http, path: str, **body):  # noqa: ANN001
    return http.post(path, json={"model": MODEL, **body})


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
def test_jina_shape_top_n_and_documents(http, reference, path):
    reply = post(http, path, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["model"] == MODEL and out["id"].startswith("rerank-")
    assert [r["index"] for r in out["results"]] == ranked(reference)[:3]
    for r in out["results"]:
        assert r["relevance_score"] == pytest.approx(reference[r["index"]], abs=1e-5)
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}  # Jina's default: returned
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] > len(DOCUMENTS)
    bare = post(http, path, query=QUERY, documents=DOCUMENTS, return_documents=False).json()
    assert len(bare["results"]) == len(DOCUMENTS) and "document" not in bare["results"][0]


def test_cohere_v2_shape_and_objects(http, reference):
    documents = [{"text": d, "title": "ignored"} for d in DOCUMENTS]
    out = post(http, "/v2/rerank", query=QUERY, documents=documents, top_n=99).json()
    assert [r["index"] for r in out["results"]] == ranked(reference)  # top_n past the count
    assert "document" not in out["results"][0]  # Cohere v2 returns none unless asked
    assert out["meta"]["api_version"] == {"version": "2"}
    asked = post(http, "/v2/rerank", query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert asked.json()["results"][0]["document"]["text"] in DOCUMENTS


def test_score_one_to_many_and_one_to_one(http, reference):
    out = post(http, "/score", text_1=QUERY, text_2=DOCUMENTS).json()
    assert out["object"] == "list" and out["model"] == MODEL
    assert [d["index"] for d in out["data"]] == list(range(len(DOCUMENTS)))
    assert [d["object"] for d in out["data"]] == ["score"] * len(DOCUMENTS)
    assert [d["score"] for d in out["data"]] == pytest.approx(reference, abs=1e-5)
    pairs = post(http, "/v1/score", text_1=[QUERY, QUERY], text_2=DOCUMENTS[:2]).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx(reference[:2], abs=1e-5)


def test_cohere_client(served, reference):
    client = cohere.ClientV2(base_url=served.url, api_key=KEY)
    reply = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in reply.results] == ranked(reference)[:2]
    assert reply.results[0].relevance_score == pytest.approx(max(reference), abs=1e-5)
    with pytest.raises(cohere.errors.NotFoundError):
        client.rerank(model="no-such-model", query=QUERY, documents=DOCUMENTS)
    with pytest.raises(cohere.errors.BadRequestError):
        client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=8)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/rerank", {"query": QUERY, "documents": ["d"] * (MAX_DOCUMENTS + 1)}, "documents"),
        ("/score", {"text_1": QUERY, "text_2": ["d"] * (MAX_DOCUMENTS + 1)}, "text_2"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/rerank", {"query": "", "documents": ["d"]}, "query"),
        ("/rerank", {"query": QUERY, "documents": [1]}, "documents.0"),
        ("/rerank", {"query": QUERY, "documents": ["d"], "top_n": -1}, "top_n"),
        ("/v2/rerank", {"query": QUERY, "documents": ["d"], "rank_fields": ["a"]}, "rank_fields"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
        ("/score", {"text_1": QUERY, "text_2": ["d"], "use_activation": False}, "use_activation"),
    ],
)
def test_bad_input_is_400(http, path, body, param):
    reply = post(http, path, **body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_model_errors(http):
    unknown = http.post("/rerank", json={"model": "nope", "query": QUERY, "documents": ["d"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    decoder = http.post("/score", json={"model": "tiny-llama", "text_1": "a", "text_2": "b"})
    assert decoder.status_code == 400 and "not a cross-encoder" in decoder.text
    embed = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert embed.status_code == 400 and "cross-encoder" in embed.json()["error"]["message"]
    # the only cross-encoder served answers a request that names none
    assert http.post("/rerank", json={"query": QUERY, "documents": ["d"]}).status_code == 200
    assert http.post("/rerank", json={"query": QUERY, "documents": ["d"]}, headers={
        "Authorization": "Bearer wrong"}).status_code == 401  # fmt: skip


def test_nothing_is_left_in_the_ledger(served, http):
    for _ in range(3):
        assert post(http, "/rerank", query=QUERY, documents=DOCUMENTS).status_code == 200
    assert idle(served), "a block or tracker entry outlived a rerank"
