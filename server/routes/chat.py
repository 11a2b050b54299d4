"""/v1/chat/completions: the messages through the model's chat template, then the same
generation as completions (prefix cache, stops, limits, disconnects), in the chat shape."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kvledger.config.frontend import Settings
from server.body_offload import OffLoopBodyRoute
from server.chat_prompt import chat_prompt
from server.chat_protocol import (
    UNSUPPORTED,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from server.chat_view import ChatView
from server.choice import Generation
from server.client import ServedModel
from server.deps import model_for, scheduler, settings_of, tenant, tenant_salt, tenant_tag
from server.errors import APIError, error_responses
from server.generation import merged
from server.offload import off_loop
from server.sampling import ChoiceOptions, build_generation, check_request
from server.streaming import drain, sse_response, until_disconnect
from server.tools import ToolPlan, tool_constraint, tool_plan

router = APIRouter(route_class=OffLoopBodyRoute)
# OpenAI's old names, refused with the one to use instead.
DEPRECATED = {"functions": "tools", "function_call": "tool_choice"}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={
        200: {
            "description": "The chat completion; with `stream`, server-sent events.",
            "content": {"text/event-stream": {"schema": ChatCompletionChunk.model_json_schema()}},
        },
        **error_responses(400, 404, 413, 429, 500, 503),
    },
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, who: str = Depends(tenant)
) -> Any:
    refuse_unsupported(body)
    model = await model_for(request, body.model)
    salt = tenant_salt(who, body.cache_salt)
    # Off the event loop, as completions: rendering and tokenizing take their time.
    settings = settings_of(request)
    generation, tools = await off_loop(
        request, prepare_chat, body, model, salt, tenant_tag(who), settings
    )
    events = merged(generation, scheduler(request))
    view = ChatView(body, generation, tools)
    if body.stream:
        return await sse_response(request, events, view.chunks, view.tail)
    await until_disconnect(request, drain(events))
    return view.response()


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    """A parameter this server does not implement is a 400 naming it, never ignored."""
    for name in UNSUPPORTED:
        value = getattr(body, name)
        if value is not None and value is not False and value != [] and value != "none":
            instead = DEPRECATED.get(name)
            if instead:
                raise APIError(
                    400,
                    f"`{name}` (deprecated by OpenAI) is not supported by this server; use "
                    f"`{instead}`",
                    param=name,
                )
            raise APIError(400, f"`{name}` is not supported by this server", param=name)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")


def prepare_chat(
    body: ChatCompletionRequest,
    model: ServedModel,
    salt: str,
    tag: str,
    settings: Settings,
    id_prefix: str = "chatcmpl",
) -> tuple[Generation, ToolPlan | None]:
    """The request's checks, tools, prompt and choices: the one way a chat turn becomes a
    generation, also for the APIs translated onto chat (server/anthropic/)."""
    spec = check_request(body, model, settings.limits, 1)
    limits = settings.limits
    tools = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls, limits)
    if tools is not None:
        spec = tool_constraint(tools, spec, body, model, limits)
    prompt = chat_prompt(
        body.messages, body, model, limits, settings.special_tokens_in_content, tools
    )
    options = ChoiceOptions(
        id_prefix=id_prefix,
        max_tokens=body.token_limit,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        prompt_param="messages",
        structured=spec,
    )
    return build_generation(body, model, [prompt], salt, tag, options), tools
