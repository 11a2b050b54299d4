"""/v1/completions: OpenAI's legacy completions, rendered from the shared generation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from server.body_offload import OffLoopBodyRoute
from server.choice import Choice, Generation, TokenEntry, stream_text
from server.client import ServedModel
from server.deps import model_for, scheduler, settings_of, tenant, tenant_salt, tenant_tag
from server.errors import APIError, error_responses
from server.generation import merged
from server.limits import Limits
from server.offload import off_loop
from server.protocol import CompletionRequest
from server.responses import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
)
from server.sampling import ChoiceOptions, build_generation, check_request
from server.streaming import drain, event, sse_response, until_disconnect
from server.tokens import Tokenized, count_prompts, echoed, token_text, tokenize_prompts

router = APIRouter(route_class=OffLoopBodyRoute)


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={
        200: {
            "description": "The completion; with `stream`, server-sent events.",
            "content": {"text/event-stream": {"schema": CompletionChunk.model_json_schema()}},
        },
        **error_responses(400, 404, 413, 429, 500, 503),
    },
)
async def completions(body: CompletionRequest, request: Request, who: str = Depends(tenant)) -> Any:
    model = await model_for(request, body.model)
    salt = tenant_salt(who, body.cache_salt)
    # Off the event loop: a long prompt takes long to tokenize (docs/performance.md, "Frontend
    # under large requests"), and the loop meanwhile streams every other request's tokens
    # (benchmarks/frontend_loop.py).
    generation, echoes = await off_loop(
        request, _prepare, body, model, salt, tenant_tag(who), settings_of(request).limits
    )
    events = merged(generation, scheduler(request))
    view = _View(body, generation, echoes)
    if body.stream:
        return await sse_response(request, events, view.chunks, view.tail)
    await until_disconnect(request, drain(events))
    return view.response()


def _prepare(
    body: CompletionRequest, model: ServedModel, salt: str, tag: str, limits: Limits
) -> tuple[Generation, list[Tokenized] | None]:
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens must be at least 1 (0 only with echo: the prompt alone)",
            param="max_tokens",
        )
    spec = check_request(body, model, limits, count_prompts(body.prompt))  # before tokenizing
    prompts = tokenize_prompts(body.prompt, model, add_special_tokens=body.add_special_tokens)
    options = ChoiceOptions(
        id_prefix="cmpl",
        max_tokens=body.max_tokens,
        top_logprobs=body.logprobs,
        # Echo with logprobs scores the prompt too.
        prompt_logprobs=body.logprobs if body.echo else None,
        echo_only=body.max_tokens == 0,
        structured=spec,
    )
    generation = build_generation(body, model, [p.ids for p in prompts], salt, tag, options)
    echoes = [echoed(model.tokenizer, p) for p in prompts] if body.echo else None
    return generation, echoes


class _View:
    """How a completion looks: its response, or its stream of chunks."""

    def __init__(
        self, body: CompletionRequest, generation: Generation, echoes: list[Tokenized] | None
    ) -> None:
        self.body = body
        self.generation = generation
        self.echoes = echoes
        self.model = generation.model

    def response(self) -> CompletionResponse:
        choices = []
        for c in self.generation.choices:
            logprobs = None
            if c.entries is not None:
                logprobs = self._logprobs(c, c.entries, with_prompt=True)
            text = self._echo_text(c) + c.text
            choices.append(CompletionChoice(index=c.index, text=text, logprobs=logprobs,
                                            finish_reason=c.finish_reason))  # fmt: skip
        g = self.generation
        return CompletionResponse(
            id=g.id, created=g.created, model=self.model.name, choices=choices, usage=g.usage()
        )

    def chunks(self, choice: Choice) -> list[str]:
        if choice.closed:  # its final chunk went out; later queue entries add nothing
            return []
        text = stream_text(choice, self.generation.holdback)
        first = not choice.started
        if first:
            text = self._echo_text(choice) + text
        if not text and choice.finish_reason is None:
            return []
        choice.started = True
        choice.closed = choice.finish_reason is not None
        logprobs = None
        if choice.entries is not None:
            logprobs = self._logprobs(choice, choice.take_entries(), with_prompt=first)
        out = CompletionChoice(
            index=choice.index, text=text, logprobs=logprobs, finish_reason=choice.finish_reason
        )
        return [self._chunk([out])]

    def tail(self) -> list[str]:
        if not self.body.include_usage:
            return []
        return [self._chunk([], self.generation.usage())]

    def _chunk(self, choices: list[CompletionChoice], usage: Any = None) -> str:
        g = self.generation
        chunk = CompletionChunk(
            id=g.id, created=g.created, model=self.model.name, choices=choices, usage=usage
        )
        return event(chunk, exclude=None if self.body.include_usage else {"usage"})

    def _echo_text(self, choice: Choice) -> str:
        if self.echoes is None:
            return ""
        return self.echoes[choice.prompt_index].text or ""

    def _logprobs(
        self, choice: Choice, entries: list[TokenEntry], with_prompt: bool
    ) -> CompletionLogprobs:
        """With echo, one entry per prompt token first (the first has no logprob), then one per
        generated token. Text offsets count from the start of the returned text."""
        columns = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        base = len(self._echo_text(choice))
        if with_prompt and self.echoes is not None and choice.prompt_entries is not None:
            prompt = self.echoes[choice.prompt_index]
            assert prompt.offsets is not None
            for token, entry, offset in zip(
                prompt.ids, choice.prompt_entries, prompt.offsets, strict=True
            ):
                self._add(columns, token, entry, offset)
        for entry in entries:
            self._add(columns, entry.token_id, entry, base + entry.offset)
        return columns

    def _add(
        self, columns: CompletionLogprobs, token: int, entry: TokenEntry | None, offset: int
    ) -> None:
        columns.tokens.append(token_text(self.model, token))
        columns.token_logprobs.append(entry.logprob if entry is not None else None)
        columns.top_logprobs.append(self._top(token, entry) if entry is not None else None)
        columns.text_offset.append(offset)

    def _top(self, token: int, entry: TokenEntry) -> dict[str, float]:
        """The most likely tokens and the sampled one, as OpenAI's legacy API and vLLM give
        them (so `logprobs: 0` still names the sampled token)."""
        top = {token_text(self.model, t): lp for t, lp in entry.top}
        if entry.logprob is not None:
            top.setdefault(token_text(self.model, token), entry.logprob)
        return top
