"""Cross-encoder routes: rerank (`/rerank` and `/v1/rerank` in Jina's shape, `/v2/rerank` in
Cohere's, as vLLM serves them) and vLLM's `/score` (also at `/v1/score`). Every route scores
its pairs with one Embed call on the embedding worker (server/scoring.py)."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Depends, Request

from kvledger.log import REQUEST_ID
from server.body_offload import OffLoopBodyRoute
from server.deps import settings_of, tenant
from server.errors import APIError, error_responses
from server.rerank_protocol import (
    ApiVersion,
    DocumentText,
    MetaTokens,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from server.scoring import check_body, cross_encoder_for, score_pairs

router = APIRouter(route_class=OffLoopBodyRoute)
ERRORS = error_responses(400, 404, 413, 429, 500, 503)
# a result's `document` and the response's `meta` are left out, not null, where not given
RERANK = {
    "response_model": RerankResponse,
    "responses": ERRORS,
    "response_model_exclude_none": True,
}


@router.post("/rerank", **RERANK)
@router.post("/v1/rerank", **RERANK)
async def rerank(
    body: RerankRequest, request: Request, who: str = Depends(tenant)
) -> RerankResponse:
    """Jina's shape (and vLLM's): documents come back unless `return_documents` is false."""
    return await _rerank(body, request, who, return_documents=True, cohere=False)


@router.post("/v2/rerank", **RERANK)
async def rerank_v2(
    body: RerankRequest, request: Request, who: str = Depends(tenant)
) -> RerankResponse:
    """Cohere's v2 shape: no documents unless `return_documents` is true, and its `meta`."""
    return await _rerank(body, request, who, return_documents=False, cohere=True)


@router.post("/score", response_model=ScoreResponse, responses=ERRORS)
@router.post("/v1/score", response_model=ScoreResponse, responses=ERRORS)
async def score(body: ScoreRequest, request: Request, who: str = Depends(tenant)) -> ScoreResponse:
    """vLLM's: text_1[i] against text_2[i], or one text_1 against every text_2."""
    check_body(body, settings_of(request).limits)
    model = await cross_encoder_for(request, body.model)
    firsts = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
    seconds = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
    if not firsts or not seconds:
        raise APIError(400, "text_1 and text_2 must each hold a text", param="text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise APIError(
            400,
            f"text_1 holds {len(firsts)} texts and text_2 {len(seconds)}: give as many, "
            "or one text_1 to score against every text_2",
            param="text_2",
        )
    scored = await score_pairs(request, model, (firsts, seconds), "text_2", who)
    return ScoreResponse(
        id=f"score-{REQUEST_ID.get() or uuid.uuid4().hex}",
        created=int(time.time()),
        model=model.name,
        data=[ScoreData(index=i, score=s) for i, s in enumerate(scored.scores)],
        usage=RerankUsage(prompt_tokens=scored.num_tokens, total_tokens=scored.num_tokens),
    )


async def _rerank(
    body: RerankRequest, request: Request, who: str, return_documents: bool, cohere: bool
) -> RerankResponse:
    """The documents in descending score (a stable sort: ties keep the documents' order), the
    first `top_n` of them (all when it is 0, unset or more than there are)."""
    check_body(body, settings_of(request).limits)
    model = await cross_encoder_for(request, body.model)
    if not body.query:
        raise APIError(400, "query must not be empty", param="query")
    if not body.documents:
        raise APIError(400, "documents must hold at least one document", param="documents")
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    scored = await score_pairs(request, model, ([body.query] * len(texts), texts), "documents", who)
    order = sorted(range(len(texts)), key=lambda i: -scored.scores[i])
    keep = order[: body.top_n] if body.top_n else order
    with_documents = return_documents if body.return_documents is None else body.return_documents
    results = [
        RerankResult(
            index=i,
            relevance_score=scored.scores[i],
            document=DocumentText(text=texts[i]) if with_documents else None,
        )
        for i in keep
    ]
    tokens = scored.num_tokens
    return RerankResponse(
        id=f"rerank-{REQUEST_ID.get() or uuid.uuid4().hex}",
        model=model.name,
        results=results,
        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
        meta=RerankMeta(api_version=ApiVersion(version="2"), tokens=MetaTokens(input_tokens=tokens))
        if cohere
        else None,
    )
