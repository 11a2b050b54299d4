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
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    Delta,
    TokenLogprob,
    TopLogprob,
)
from server.client import ServedModel
from server.deps import model_for, scheduler, settings_of, tenant, tenant_salt, tenant_tag
from server.errors import APIError, error_responses
from server.generation import Choice, Generation, TokenEntry, merged, stream_text
from server.offload import off_loop
from server.sampling import Plan, build_generation, check_request
from server.streaming import drain, event, sse_response, until_disconnect
from server.tokens import token_text

router = APIRouter(route_class=OffLoopBodyRoute)


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
    generation = await off_loop(request, _prepare, body, model, salt, tenant_tag(who), settings)
    events = merged(generation, scheduler(request))
    view = _ChatView(body, generation)
    if body.stream:
        return await sse_response(request, events, view.chunks, view.tail)
    await until_disconnect(request, drain(events))
    return view.response()


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    """A parameter this server does not implement is a 400 naming it, never ignored."""
    for name in UNSUPPORTED:
        value = getattr(body, name)
        if value is not None and value is not False and value != [] and value != "none":
            raise APIError(400, f"`{name}` is not supported by this server", param=name)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")


def _prepare(
    body: ChatCompletionRequest, model: ServedModel, salt: str, tag: str, settings: Settings
) -> Generation:
    spec = check_request(body, model, settings.limits, 1)
    prompt = chat_prompt(
        body.messages, body, model, settings.limits, settings.special_tokens_in_content
    )
    plan = Plan(
        id_prefix="chatcmpl",
        max_tokens=body.token_limit,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        prompt_param="messages",
        structured=spec,
    )
    return build_generation(body, model, [prompt], salt, tag, plan)


class _ChatView:
    """How a chat completion looks: its response, or its stream of chunks."""

    def __init__(self, body: ChatCompletionRequest, generation: Generation) -> None:
        self.body = body
        self.generation = generation
        self.model = generation.model

    def response(self) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                logprobs=self._logprobs(c.entries),
                finish_reason=c.finish_reason,
            )
            for c in self.generation.choices
        ]
        g = self.generation
        return ChatCompletionResponse(
            id=g.id, created=g.created, model=self.model.name, choices=choices, usage=g.usage()
        )

    def chunks(self, choice: Choice) -> list[str]:
        """The role first, then content deltas, then the finish reason, each its own chunk."""
        out = []
        if not choice.started:
            choice.started = True
            out.append(self._chunk(choice, Delta(role="assistant", content="")))
        if choice.closed:
            return out
        text = stream_text(choice, self.generation.holdback)
        entries = choice.take_entries() if choice.entries is not None else None
        if text or entries:
            out.append(self._chunk(choice, Delta(content=text), self._logprobs(entries)))
        if choice.finish_reason is not None:
            choice.closed = True
            out.append(self._chunk(choice, Delta(), finish=choice.finish_reason))
        return out

    def tail(self) -> list[str]:
        if not self.body.include_usage:
            return []
        g = self.generation
        chunk = ChatCompletionChunk(
            id=g.id, created=g.created, model=self.model.name, choices=[], usage=g.usage()
        )
        return [event(chunk)]

    def _chunk(
        self,
        choice: Choice,
        delta: Delta,
        logprobs: ChoiceLogprobs | None = None,
        finish: str | None = None,
    ) -> str:
        g = self.generation
        part = ChatChunkChoice(
            index=choice.index, delta=delta, logprobs=logprobs, finish_reason=finish
        )
        chunk = ChatCompletionChunk(id=g.id, created=g.created, model=self.model.name,
                                    choices=[part])  # fmt: skip
        return event(chunk, exclude=None if self.body.include_usage else {"usage"})

    def _logprobs(self, entries: list[TokenEntry] | None) -> ChoiceLogprobs | None:
        if entries is None:
            return None
        return ChoiceLogprobs(content=[self._entry(e) for e in entries])

    def _entry(self, entry: TokenEntry) -> TokenLogprob:
        top = [self._top(t, lp) for t, lp in entry.top][: self.body.top_logprobs or 0]
        token = entry.token_id
        return TokenLogprob(
            token=token_text(self.model, token),
            logprob=entry.logprob,
            bytes=list(self.model.token_bytes(token)),
            top_logprobs=top,
        )

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = token_text(self.model, token)
        return TopLogprob(token=text, logprob=logprob, bytes=list(self.model.token_bytes(token)))
