"""/v1/completions: one Generate stream per choice, detokenized, with stop strings applied."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from tokenizers import Tokenizer

from protos import frontend_pb2, frontend_pb2_grpc
from server.client import ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError, from_grpc
from server.limits import Limits, check_completion
from server.protocol import CompletionRequest, Prompt

FINISH_TIMEOUT_SECONDS = 2.0
SEED_RANGE = 2**64  # SamplingParams.seed is a uint64
LOGPROB_FLOOR = -9999.0  # vLLM's: JSON has no -inf


@dataclass
class LogprobColumns:
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(
        self, token: str, logprob: float | None, top: dict[str, float] | None, offset: int
    ) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def truncate(self, keep: int) -> None:
        for column in (self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset):
            del column[keep:]

    def body(self, start: int = 0, end: int | None = None) -> dict:
        return {
            "tokens": self.tokens[start:end],
            "token_logprobs": self.token_logprobs[start:end],
            "top_logprobs": self.top_logprobs[start:end],
            "text_offset": self.text_offset[start:end],
        }


@dataclass
class ChoiceLogprobs:
    """OpenAI's legacy completions logprobs: with echo, one entry per prompt token first (the
    first has no logprob), then one per generated token. Text offsets count from the start of
    the returned text, echoed prompt included."""

    echo_length: int = 0  # where the generated text starts in the returned text
    awaiting_prompt: bool = False  # echo: the prompt's entries come with the first response
    prompt: LogprobColumns = field(default_factory=LogprobColumns)
    output: LogprobColumns = field(default_factory=LogprobColumns)
    sent: int = 0  # output entries already streamed
    prompt_sent: bool = False

    def add(
        self,
        token: str,
        entry: frontend_pb2.TokenLogprob,
        offset: int,
        top: dict[str, float] | None,
    ) -> None:
        """A generated token whose text starts at `offset` of the generated text."""
        self.output.add(token, _json_logprob(entry.logprob), top, self.echo_length + offset)

    def truncate(self, text_length: int) -> None:
        """A stop string cut the generated text: drop the tokens that now lie past its end."""
        self.output.truncate(self._starting_before(text_length))

    def take_sent(self, text_sent: int, final: bool) -> dict:
        """Streaming: the entries whose text has started going out (all of them at the end),
        so a stop string that later cuts the text never leaves a streamed token behind. The
        prompt's entries go out with the first chunk, as the echoed prompt does."""
        end = len(self.output) if final else self._starting_before(text_sent)
        start, self.sent = self.sent, max(self.sent, end)
        body = self.output.body(start, self.sent)
        if not self.prompt_sent:
            self.prompt_sent = True
            body = _joined(self.prompt.body(), body)
        return body

    def body(self) -> dict:
        return _joined(self.prompt.body(), self.output.body())

    def _starting_before(self, text_length: int) -> int:
        limit = self.echo_length + text_length
        return sum(1 for offset in self.output.text_offset if offset < limit)


def _joined(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}


def _json_logprob(value: float) -> float | None:
    """A logprob as JSON can carry it, as vLLM does: -inf (a token the model gives no chance,
    or logits spread beyond float32) is clamped to -9999.0; NaN (the scheduler's mark for a
    logprob the worker did not send) and +inf (never a logprob) are null."""
    if math.isnan(value) or value == math.inf:
        return None
    return max(value, LOGPROB_FLOOR)


@dataclass(frozen=True)
class Echo:
    """A prompt as echoed: its text, and where each of its tokens' text starts in it."""

    text: str
    offsets: list[int]


def echo_of(tokenizer: Tokenizer, prompt: list[int]) -> Echo:
    """Token by token, as generated text is detokenized, so that offsets index the text."""
    detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    text, offsets = "", []
    for token in prompt:
        offsets.append(len(text))
        text += detokenizer.push([token])
    return Echo(text + detokenizer.flush(), offsets)


@dataclass
class Choice:
    index: int
    prompt_index: int
    request: frontend_pb2.GenerateRequest
    detokenizer: IncrementalDetokenizer
    text: str = ""
    sent: int = 0  # characters of text already streamed
    echoed: bool = False
    closed: bool = False  # streaming: the chunk with the finish reason was sent
    # max_tokens 0 with echo (OpenAI's way to score a prompt alone): the one token generated
    # to end the request is dropped.
    echo_only: bool = False
    num_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


@dataclass
class Completion:
    id: str
    model: ServedModel
    body: CompletionRequest
    prompts: list[list[int]]
    echoes: list[Echo] = field(default_factory=list)  # one per prompt, with echo
    choices: list[Choice] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.body.stop_strings), default=0)

    def usage(self) -> dict:
        prompt_tokens = sum(len(p) for p in self.prompts)
        completion_tokens = sum(c.num_tokens for c in self.choices)
        cached = [0] * len(self.prompts)
        for c in self.choices:
            cached[c.prompt_index] = max(cached[c.prompt_index], c.num_cached_tokens)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(cached)},
        }


def tokenize_prompts(prompt: Prompt, model: ServedModel, param: str = "prompt") -> list[list[int]]:
    """Token ids of each prompt; `param` names the request's field in errors."""
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)  # type: ignore[arg-type]
    else:
        texts = None
    if texts is not None:
        if any(not t for t in texts):
            raise APIError(400, f"{param} must not be empty", param=param)
        prompts = [e.ids for e in model.tokenizer.encode_batch(texts)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [list(p) for p in prompt]  # type: ignore[union-attr]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise APIError(400, f"{param} must not be empty", param=param)
    return prompts


def build_completion(
    body: CompletionRequest, model: ServedModel, salt: str, limits: Limits
) -> Completion:
    if model.is_embedding:
        raise APIError(400, f"model `{model.name}` is an embedding model", param="model")
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens must be at least 1 (0 only with echo: the prompt alone)",
            param="max_tokens",
        )
    prompts = tokenize_prompts(body.prompt, model)
    check_completion(body, limits, len(prompts))
    limit = model.info.max_model_len
    completion = Completion(id=f"cmpl-{uuid.uuid4().hex}", model=model, body=body, prompts=prompts)
    if body.echo:
        completion.echoes = [echo_of(model.tokenizer, p) for p in prompts]
    for p_index, prompt in enumerate(prompts):
        # Without max_tokens, a completion may fill the context, but must have room for one.
        max_tokens = body.max_tokens if body.max_tokens is not None else limit - len(prompt)
        max_tokens = max(max_tokens, 1)
        if len(prompt) + max_tokens > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.",
                param="prompt",
                code="context_length_exceeded",
            )
        for sample in range(body.n):
            index = len(completion.choices)
            request = _generate_request(
                body, model, prompt, max_tokens, salt, f"{completion.id}-{index}", sample
            )
            detok = IncrementalDetokenizer(model.tokenizer, prompt, body.skip_special_tokens)
            choice = Choice(index, p_index, request, detok, echo_only=body.max_tokens == 0)
            if body.logprobs is not None:
                choice.logprobs = ChoiceLogprobs()
                if body.echo:
                    choice.logprobs.echo_length = len(completion.echoes[p_index].text)
                    choice.logprobs.awaiting_prompt = True
            completion.choices.append(choice)
    return completion


def _generate_request(
    body: CompletionRequest,
    model: ServedModel,
    prompt: list[int],
    max_tokens: int,
    salt: str,
    request_id: str,
    sample_index: int = 0,
) -> frontend_pb2.GenerateRequest:
    temperature = 1.0 if body.temperature is None else body.temperature
    sampling = frontend_pb2.SamplingParams(
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        min_p=body.min_p or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        logprobs=-1 if body.logprobs is None else body.logprobs,
    )
    if body.seed is not None:
        # The n samples of a prompt differ, yet the whole response is reproducible (vLLM's
        # seed + index); the worker's noise depends only on (seed, position).
        sampling.seed = (body.seed + sample_index) % SEED_RANGE
    scores_prompt = body.echo and body.logprobs is not None
    if scores_prompt:
        sampling.prompt_logprobs = body.logprobs
    stop = frontend_pb2.StopCriteria(
        max_tokens=max_tokens,
        stop_token_ids=body.stop_token_ids or [],
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
    )
    return frontend_pb2.GenerateRequest(
        request_id=request_id,
        model=model.name,
        prompt_token_ids=prompt,
        sampling=sampling,
        stop=stop,
        cache_salt=salt,
        priority=body.priority,
        skip_prefix_cache=scores_prompt,
    )


async def run_choice(
    stub: frontend_pb2_grpc.SchedulerStub, completion: Completion, choice: Choice
) -> AsyncIterator[None]:
    """Drives one choice; yields each time its text or finish reason changed."""
    stops = completion.body.stop_strings
    call = stub.Generate(choice.request)
    try:
        async for response in call:
            choice.num_cached_tokens = response.num_cached_tokens
            if choice.logprobs is not None and choice.logprobs.awaiting_prompt:
                _add_prompt_logprobs(completion, choice, response.prompt_logprobs)
            if not choice.echo_only:
                _push(completion, choice, response)
            if response.finish_reason:
                if response.finish_reason == "error":
                    raise APIError(500, response.message or "the worker failed this request")
                choice.text += choice.detokenizer.flush()
                length = response.finish_reason == "length" or choice.echo_only
                choice.finish_reason = "length" if length else "stop"
            if stops and _cut_at_stop(choice, stops):
                if not response.finish_reason:
                    await _finish_early(stub, choice.request.request_id)
                choice.finish_reason = "stop"
                if choice.logprobs is not None:
                    choice.logprobs.truncate(len(choice.text))
            yield
            if choice.finish_reason is not None:
                return
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None
    finally:
        call.cancel()  # no-op when finished; aborts the request when we stop early


async def _finish_early(stub: frontend_pb2_grpc.SchedulerStub, request_id: str) -> None:
    """A stop string ended a request the scheduler still runs: tell it that the request
    finished (not that its client gave up) before the call is cancelled. If this fails, the
    cancellation still ends the request, counted as an abort."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await stub.Abort(
            frontend_pb2.AbortRequest(request_id=request_id, reason="stop"),
            timeout=FINISH_TIMEOUT_SECONDS,
        )


def _push(completion: Completion, choice: Choice, response: frontend_pb2.GenerateResponse) -> None:
    choice.num_tokens += len(response.token_ids)
    if choice.logprobs is not None:
        _push_with_logprobs(completion, choice, response)
    else:
        choice.text += choice.detokenizer.push(list(response.token_ids))


def _push_with_logprobs(
    completion: Completion, choice: Choice, response: frontend_pb2.GenerateResponse
) -> None:
    """Token by token, so each token's text offset is known."""
    assert choice.logprobs is not None
    for token, entry in zip(response.token_ids, response.logprobs, strict=True):
        offset = len(choice.text)
        choice.text += choice.detokenizer.push([token])
        choice.logprobs.add(_token_text(completion, token), entry, offset, _top(completion, entry))


def _add_prompt_logprobs(
    completion: Completion, choice: Choice, entries: Sequence[frontend_pb2.TokenLogprob]
) -> None:
    """The echoed prompt's entries, all sent with the first response: the first token has no
    logprob; one the scheduler did not send (a bug signal it logs) shows as null too."""
    assert choice.logprobs is not None
    prompt = completion.prompts[choice.prompt_index]
    offsets = completion.echoes[choice.prompt_index].offsets
    scored: list[frontend_pb2.TokenLogprob | None] = [None, *entries]
    for i, token in enumerate(prompt):
        entry = scored[i] if i < len(scored) else None
        logprob = _json_logprob(entry.logprob) if entry is not None else None
        top = _top(completion, entry) if entry is not None else None
        choice.logprobs.prompt.add(_token_text(completion, token), logprob, top, offsets[i])
    choice.logprobs.awaiting_prompt = False


def _token_text(completion: Completion, token: int) -> str:
    return completion.model.tokenizer.decode([token], skip_special_tokens=False)


def _top(completion: Completion, entry: frontend_pb2.TokenLogprob) -> dict[str, float] | None:
    if not completion.body.logprobs:
        return None
    top = {}
    for t in entry.top:
        logprob = _json_logprob(t.logprob)
        if logprob is not None:  # a dict of numbers: an alternative without one is left out
            top[_token_text(completion, t.token_id)] = logprob
    return top


def _cut_at_stop(choice: Choice, stops: list[str]) -> bool:
    window_start = max(0, choice.sent - max(len(s) for s in stops))
    hits = [i for s in stops if (i := choice.text.find(s, window_start)) != -1]
    if not hits:
        return False
    choice.text = choice.text[: min(hits)]
    return True


async def merged(
    streams: list[AsyncIterator[None]], choices: list[Choice]
) -> AsyncIterator[Choice]:
    """Runs every choice concurrently; yields the choice that changed, as it changes."""
    queue: asyncio.Queue[tuple[Choice, BaseException | None] | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[None], choice: Choice) -> None:
        try:
            async for _ in stream:
                await queue.put((choice, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            await queue.put((choice, err))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(s, c)) for s, c in zip(streams, choices, strict=True)]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            choice, err = item
            if err is not None:
                raise err
            yield choice
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def stream_text(choice: Choice, holdback: int) -> str:
    """Text of a choice that is safe to send now (a stop string may still be forming)."""
    if choice.finish_reason:
        end = len(choice.text)
    else:
        end = max(choice.sent, len(choice.text) - holdback)
    delta = choice.text[choice.sent : end]
    choice.sent = end
    return delta


def echo_prefix(completion: Completion, choice: Choice) -> str:
    if not completion.body.echo:
        return ""
    return completion.echoes[choice.prompt_index].text
