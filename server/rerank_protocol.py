"""Request and response bodies of the cross-encoder routes: rerank in Jina's and Cohere's shapes
(`/rerank`, `/v1/rerank`, `/v2/rerank`, as vLLM serves them) and vLLM's `/score`.

Validated strictly, as every body is (server/protocol.py); fields no schema defines are
ignored. The fields of those APIs this server does not implement are refused by name unless
left at a value that asks for nothing (`RERANK_NOT_IMPLEMENTED_UNLESS`, checked by
server/scoring.py; every decision: docs/api.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from server.protocol import INT32_MAX, REQUEST_CONFIG, text_fields

# Cohere's and vLLM's fields, each with the values that ask for nothing this server lacks.
# Truncation is always sentence-transformers' (each pair to the model's length, longest
# text first); the scores are always the model's activation of its logits.
RERANK_NOT_IMPLEMENTED_UNLESS: dict[str, tuple[object, ...]] = {
    "truncate_prompt_tokens": (None, -1),  # vLLM's; -1: the model's length, as here
    "use_activation": (None, True),  # vLLM's; raw logits are not served
    "activation": (None, True),  # vLLM's older name of use_activation
    "softmax": (None, True),  # vLLM's oldest name of it
    "max_tokens_per_doc": (None,),  # Cohere v2's own truncation
    "max_chunks_per_doc": (None,),  # Cohere v1's document chunking
    "rank_fields": (None, ["text"]),  # Cohere v1: only a document's text is ranked
    "relevant_spans": (None,),  # Cohere v2's span extraction
    "priority": (None, 0),  # an Embed call has no priority
    "mm_processor_kwargs": (None, {}),  # vLLM's multimodal inputs: text only here
}


class RerankDocument(BaseModel):
    """A document as Cohere v1 also takes it: an object with its `text` (other fields are
    ignored, and not returned)."""

    model_config = REQUEST_CONFIG
    text: str

    _check_text = text_fields("text")


class RerankRequest(BaseModel):
    """Jina's and Cohere's rerank request (vLLM's fields too). `model` may be left out when
    one cross-encoder is served; `top_n` 0 or unset returns every document; unset
    `return_documents` is the route's default (server/routes/rerank.py)."""

    model_config = REQUEST_CONFIG
    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(None, ge=0, le=INT32_MAX)
    return_documents: bool | None = None
    user: str | None = None

    _check_text = text_fields("model", "query", "documents")


class ScoreRequest(BaseModel):
    """vLLM's /score: each text of `text_1` scored against the text of `text_2` at its index,
    or one `text_1` against every `text_2`."""

    model_config = REQUEST_CONFIG
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    user: str | None = None

    _check_text = text_fields("model", "text_1", "text_2")


class DocumentText(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int  # the document's place in the request
    relevance_score: float
    document: DocumentText | None = None  # with return_documents


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ApiVersion(BaseModel):
    version: str


class MetaTokens(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class RerankMeta(BaseModel):
    """Cohere's `meta`: its API version, and the tokens read."""

    api_version: ApiVersion
    tokens: MetaTokens


class RerankResponse(BaseModel):
    """Results in descending relevance (ties in the documents' order)."""

    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage
    meta: RerankMeta | None = None  # Cohere's, on /v2/rerank


class ScoreData(BaseModel):
    index: int  # the pair's place in the request
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: RerankUsage
