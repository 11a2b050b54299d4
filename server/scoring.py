"""Text pairs scored by a cross-encoder, on the embedding path: each pair is tokenized as
sentence-transformers' `CrossEncoder` tokenizes it (`ServedModel.pair_tokenizer`: [CLS] a [SEP]
b [SEP], token types, truncated longest text first to the model's length), and one `Embed`
call carries them all, each input marking where its second text starts (`type_start`). The
embedding worker returns each pair's scores as its vector; the scheduler handles them as any
embedding request (one pass each, no KV block or tracker entry left behind)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import grpc
from fastapi import Request

from kvledger.config.frontend import Limits
from kvledger.log import REQUEST_ID
from protos import frontend_pb2
from server.bounds import check_count, check_names
from server.client import ServedModel
from server.deps import model_for, scheduler, tenant_tag
from server.errors import APIError, from_grpc
from server.offload import off_loop
from server.rerank_protocol import RERANK_NOT_IMPLEMENTED_UNLESS, RerankRequest, ScoreRequest
from server.sampling import refuse_unless_no_op
from server.streaming import until_disconnect


@dataclass(frozen=True)
class Scored:
    scores: list[float]  # one per pair, in the pairs' order
    num_tokens: int  # every pair's tokens, special tokens included


async def cross_encoder_for(request: Request, name: str | None) -> ServedModel:
    """The named model (404 when unknown), or the only cross-encoder served when none is
    named; a 400 for a model that is not a cross-encoder, or gives a pair more than one
    score (as `CrossEncoder.rank` refuses it: a ranking needs one number per document)."""
    if name is None:
        models = await scheduler(request).models()
        found = [m for m in models.values() if m.is_cross_encoder]
        if len(found) != 1:
            names = ", ".join(sorted(m.name for m in found)) or "none is served"
            raise APIError(400, f"`model` is required: cross-encoders: {names}", param="model")
        return found[0]
    model = await model_for(request, name)
    if not model.is_cross_encoder:
        raise APIError(
            400,
            f"The model `{model.name}` is not a cross-encoder (a sequence-classification "
            "model): it cannot rerank or score text pairs.",
            param="model",
        )
    if model.info.num_labels != 1:
        raise APIError(
            400,
            f"The model `{model.name}` gives {model.info.num_labels} scores per pair; "
            "rerank and score need a model with one (num_labels 1).",
            param="model",
        )
    return model


def check_body(body: RerankRequest | ScoreRequest, limits: Limits) -> None:
    """Names and the fields this server does not implement, before any text is tokenized."""
    check_names(limits, model=body.model, user=body.user)
    extra = body.model_extra or {}
    for name, no_ops in RERANK_NOT_IMPLEMENTED_UNLESS.items():
        refuse_unless_no_op(name, extra.get(name), no_ops)


def score_pairs_inputs(
    model: ServedModel, firsts: list[str], seconds: list[str], param: str, limits: Limits
) -> tuple[list[frontend_pb2.TokenIds], int]:
    """Each pair's tokens and where its second text starts; the tokens of them all. Run off
    the event loop (tokenizing is CPU work)."""
    check_count(len(seconds), limits.max_rerank_documents, param, f"texts in {param}")
    try:
        encodings = model.pair_tokenizer.encode_batch(list(zip(firsts, seconds, strict=True)))
    except Exception as err:  # noqa: BLE001 - the tokenizer's own refusal (e.g. no room left)
        raise APIError(400, f"cannot tokenize the pairs: {err}", param=param) from None
    inputs = [_pair(e.ids, e.type_ids, model.name) for e in encodings]
    return inputs, sum(len(i.ids) for i in inputs)


def _pair(ids: list[int], type_ids: list[int], name: str) -> frontend_pb2.TokenIds:
    """The second text starts at the first token of type 1, and every token after it is of
    type 1 too (BERT's pair template); a tokenizer that marks pairs otherwise is refused."""
    start = type_ids.index(1) if 1 in type_ids else 0
    if not start or any(t != 1 for t in type_ids[start:]) or any(type_ids[:start]):
        raise APIError(
            400,
            f"the tokenizer of model `{name}` does not mark text pairs as BERT does "
            "(token type 0 for the first text, 1 for the second)",
            param="model",
        )
    return frontend_pb2.TokenIds(ids=ids, type_start=start)


async def score_pairs(
    request: Request,
    model: ServedModel,
    pairs: tuple[list[str], list[str]],
    param: str,
    who: str,
) -> Scored:
    """The score of each (first, second) pair, from one Embed call."""
    limits = request.app.state.settings.limits
    inputs, num_tokens = await off_loop(request, score_pairs_inputs, model, *pairs, param, limits)
    req = frontend_pb2.EmbedRequest(
        request_id=f"score-{REQUEST_ID.get() or uuid.uuid4().hex}",
        model=model.name,
        normalize=False,  # a cross-encoder's scores are the activation's, never normalized
        inputs=inputs,
        tenant=tenant_tag(who),
    )
    try:
        reply = await until_disconnect(request, scheduler(request).stub.Embed(req))
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None
    return Scored([e.values[0] for e in reply.embeddings], reply.num_prompt_tokens or num_tokens)
