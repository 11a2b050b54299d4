"""/tokenize, /detokenize and /tokenizer_info (vLLM's): a prompt, or chat messages through
the model's template, to token ids, and back; and the tokenizer's configuration. `model` may be
left out when one generative model is served (lm-eval's remote tokenizer names none)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from kvledger.config.frontend import Limits, Settings
from server.body_offload import OffLoopBodyRoute
from server.bounds import check_names, check_token_ids
from server.chat_prompt import chat_prompt
from server.chat_protocol import ChatMessage, ChatTemplateOptions
from server.client import ServedModel
from server.deps import named_or_only_model, settings_of
from server.errors import APIError, error_responses
from server.offload import off_loop
from server.protocol import REQUEST_CONFIG, DetokenizeRequest, text_fields
from server.tokenizer_info import TokenizerInfoResponse, tokenizer_info
from server.tokens import check_text_fits, token_text

router = APIRouter(route_class=OffLoopBodyRoute)


class TokenizeRequest(ChatTemplateOptions):
    """Either `prompt` (add_special_tokens defaults to true) or chat `messages` (rendered as
    /v1/chat/completions renders them; add_special_tokens defaults to false)."""

    # The example is the documentation's, and the API fuzz test's one certain valid body: a
    # generated body holds both fields or neither far more often than exactly one.
    model_config = ConfigDict(
        **REQUEST_CONFIG,
        json_schema_extra={"examples": [{"model": "tiny-llama", "prompt": "The ledger says"}]},
    )
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # type: ignore[assignment]
    return_token_strs: bool = False

    _check_text = text_fields("model", "prompt")


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


@router.post(
    "/tokenize",
    response_model=TokenizeResponse,
    responses=error_responses(400, 404, 413, 503),
)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either `prompt` or `messages`", param="prompt")
    model = await named_or_only_model(request, body.model)
    # Off the event loop, as completions: tokenizing and rendering take their time.
    return await off_loop(request, _tokenized, body, model, settings_of(request))


def _tokenized(body: TokenizeRequest, model: ServedModel, settings: Settings) -> TokenizeResponse:
    """The prompt bounded as completions bound it (a text longer than the model's prompt
    bound is refused before tokenizing), messages as chat bounds them."""
    check_names(settings.limits, model=body.model)
    if body.messages is not None:
        if not body.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        special = bool(body.add_special_tokens)
        options = body.model_copy(update={"add_special_tokens": special})
        ids = chat_prompt(
            body.messages, options, model, settings.limits, settings.special_tokens_in_content
        )
    else:
        check_text_fits(len(body.prompt or ""), model, "prompt")
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = model.tokenizer.encode(body.prompt or "", add_special_tokens=special).ids
    return TokenizeResponse(
        tokens=ids,
        count=len(ids),
        max_model_len=model.info.max_model_len,
        token_strs=[token_text(model, t) for t in ids] if body.return_token_strs else None,
    )


@router.post(
    "/detokenize",
    response_model=DetokenizeResponse,
    responses=error_responses(400, 404, 413, 503),
)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    model = await named_or_only_model(request, body.model)
    return await off_loop(request, _detokenized, body, model, settings_of(request).limits)


def _detokenized(body: DetokenizeRequest, model: ServedModel, limits: Limits) -> DetokenizeResponse:
    """At most the model's context of tokens (no prompt or completion is longer), each inside
    its vocabulary, decoded off the event loop."""
    check_names(limits, model=body.model)
    limit = model.info.max_model_len
    if len(body.tokens) > limit:
        raise APIError(
            400,
            f"at most {limit} tokens (the model's context length) per request",
            param="tokens",
        )
    check_token_ids(body.tokens, model.info.vocab_size, "tokens")
    return DetokenizeResponse(prompt=model.tokenizer.decode(body.tokens))


@router.get(
    "/tokenizer_info",
    response_model=TokenizerInfoResponse,
    responses=error_responses(400, 404, 503),
)
async def get_tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
    """The tokenizer of `model` (a query parameter), or of the only generative model."""
    check_names(settings_of(request).limits, model=model)
    served = await named_or_only_model(request, model)
    return await off_loop(request, tokenizer_info, served)  # reads its files the first time
