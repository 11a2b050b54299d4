"""/v1/embeddings: one Embed call for all inputs."""

from __future__ import annotations

import base64
import uuid

import grpc
import numpy as np
from fastapi import APIRouter, Depends, Request

from kvledger.config.frontend import Limits
from kvledger.log import REQUEST_ID
from protos import frontend_pb2
from server.body_offload import OffLoopBodyRoute
from server.bounds import check_names
from server.client import ServedModel
from server.deps import model_for, scheduler, settings_of, tenant, tenant_tag
from server.errors import APIError, error_responses, from_grpc
from server.offload import off_loop
from server.protocol import EmbeddingRequest
from server.responses import Embedding, EmbeddingResponse, EmbeddingUsage
from server.streaming import until_disconnect
from server.tokens import Tokenized, count_prompts, tokenize_prompts

router = APIRouter(route_class=OffLoopBodyRoute)


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingResponse,
    responses=error_responses(400, 404, 413, 429, 500, 503),
)
async def embeddings(
    body: EmbeddingRequest, request: Request, who: str = Depends(tenant)
) -> EmbeddingResponse:
    model = await model_for(request, body.model)  # decoders embed too (last-token pooling)
    if model.is_cross_encoder:  # its vectors are a text pair's scores, not an embedding
        raise APIError(
            400,
            f"The model `{model.name}` is a cross-encoder: it scores text pairs "
            "(/rerank, /score) and computes no embeddings.",
            param="model",
        )
    prompts = await off_loop(request, _tokenized, body, model, settings_of(request).limits)
    inputs = [p.ids for p in prompts]
    width = model.info.embedding_size
    if body.dimensions is not None and width and body.dimensions > width:
        raise APIError(
            400,
            f"dimensions must be at most {width} for model `{model.name}`",
            param="dimensions",
        )
    too_long = next((len(i) for i in inputs if len(i) > model.info.max_model_len), None)
    if too_long is not None:
        raise APIError(
            400,
            f"This model's maximum context length is "
            f"{model.info.max_model_len} tokens. However, you requested "
            f"{too_long} tokens in the input for embedding generation. Please "
            "reduce the length of the input.",
            param="input",
            code="context_length_exceeded",
        )
    req = frontend_pb2.EmbedRequest(
        request_id=f"embd-{REQUEST_ID.get() or uuid.uuid4().hex}",
        model=model.name,
        normalize=True,
        dimensions=body.dimensions or 0,
        inputs=[frontend_pb2.TokenIds(ids=ids) for ids in inputs],
        tenant=tenant_tag(who),
    )
    try:
        reply = await until_disconnect(request, scheduler(request).stub.Embed(req))
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None
    data = [
        Embedding(index=i, embedding=_encoded(list(e.values), body.encoding_format))
        for i, e in enumerate(reply.embeddings)
    ]
    tokens = reply.num_prompt_tokens
    return EmbeddingResponse(
        data=data,
        model=model.name,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


def _tokenized(body: EmbeddingRequest, model: ServedModel, limits: Limits) -> list[Tokenized]:
    """The inputs counted and the model name measured before any is tokenized."""
    check_names(limits, model=body.model, user=body.user)
    limit = limits.max_embedding_inputs
    if count_prompts(body.input) > limit:
        raise APIError(400, f"at most {limit} inputs per request", param="input")
    return tokenize_prompts(body.input, model, param="input")


def _encoded(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()
    return values
