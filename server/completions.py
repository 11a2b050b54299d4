"""/v1/completions: one Generate stream per choice, detokenized, with stop strings applied."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from protos import frontend_pb2, frontend_pb2_grpc
from server.client import ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError, from_grpc
from server.limits import Limits, check_completion
from server.protocol import CompletionRequest


@dataclass
class ChoiceLogprobs:
    """OpenAI's legacy completions logprobs, one entry per generated token."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    sent: int = 0  # entries already streamed

    def add(self, token: str, entry: frontend_pb2.TokenLogprob, offset: int,
            top: dict[str, float] | None) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(_finite(entry.logprob))
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def truncate(self, text_length: int) -> None:
        """A stop string cut the text: drop the tokens that now lie past its end."""
        keep = sum(1 for offset in self.text_offset if offset < text_length)
        for column in (self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset):
            del column[keep:]

    def take_sent(self, text_sent: int, final: bool) -> dict:
        """Streaming: the entries whose text has started going out (all of them at the end),
        so a stop string that later cuts the text never leaves a streamed token behind."""
        end = len(self.tokens) if final else sum(1 for o in self.text_offset if o < text_sent)
        start, self.sent = self.sent, max(self.sent, end)
        return self.body(start, self.sent)

    def body(self, start: int = 0, end: int | None = None) -> dict:
        return {"tokens": self.tokens[start:end], "token_logprobs": self.token_logprobs[start:end],
                "top_logprobs": self.top_logprobs[start:end],
                "text_offset": self.text_offset[start:end]}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


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
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": sum(cached)}}


def _reject_unsupported(body: CompletionRequest) -> None:
    """Fields whose sampling the worker does not implement yet: refuse rather than ignore."""
    unsupported = {"echo with logprobs": body.echo and body.logprobs is not None}
    for param, used in unsupported.items():
        if used:
            raise APIError(400, f"`{param}` is not supported by this server yet", param=param)


def tokenize_prompts(body: CompletionRequest, model: ServedModel) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)  # type: ignore[arg-type]
    else:
        texts = None
    if texts is not None:
        if any(not t for t in texts):
            raise APIError(400, "prompt must not be empty", param="prompt")
        prompts = [e.ids for e in model.tokenizer.encode_batch(texts)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [list(p) for p in prompt]  # type: ignore[union-attr]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise APIError(400, "prompt must not be empty", param="prompt")
    return prompts


def build_completion(body: CompletionRequest, model: ServedModel, salt: str,
                     limits: Limits) -> Completion:
    if model.is_embedding:
        raise APIError(400, f"model `{model.name}` is an embedding model", param="model")
    _reject_unsupported(body)
    prompts = tokenize_prompts(body, model)
    check_completion(body, limits, len(prompts))
    limit = model.info.max_model_len
    completion = Completion(id=f"cmpl-{uuid.uuid4().hex}", model=model, body=body,
                            prompts=prompts)
    for p_index, prompt in enumerate(prompts):
        # Without max_tokens, a completion may fill the context, but must have room for one.
        max_tokens = body.max_tokens if body.max_tokens is not None else limit - len(prompt)
        max_tokens = max(max_tokens, 1)
        if len(prompt) + max_tokens > limit:
            raise APIError(
                400, f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.", param="messages", code="context_length_exceeded")
        for n in range(body.n):
            index = len(completion.choices)
            request = _generate_request(body, model, prompt, max_tokens, salt,
                                        f"{completion.id}-{index}")
            detok = IncrementalDetokenizer(model.tokenizer, prompt, body.skip_special_tokens)
            choice = Choice(index, p_index, request, detok)
            if body.logprobs is not None:
                choice.logprobs = ChoiceLogprobs()
            completion.choices.append(choice)
            del n
    return completion


def _generate_request(body: CompletionRequest, model: ServedModel, prompt: list[int],
                      max_tokens: int, salt: str, request_id: str
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
        sampling.seed = body.seed
    stop = frontend_pb2.StopCriteria(max_tokens=max_tokens,
                                     stop_token_ids=body.stop_token_ids or [],
                                     ignore_eos=body.ignore_eos, min_tokens=body.min_tokens)
    return frontend_pb2.GenerateRequest(
        request_id=request_id, model=model.name, prompt_token_ids=prompt, sampling=sampling,
        stop=stop, cache_salt=salt, priority=body.priority)


async def run_choice(stub: frontend_pb2_grpc.SchedulerStub, completion: Completion,
                     choice: Choice) -> AsyncIterator[None]:
    """Drives one choice; yields each time its text or finish reason changed."""
    stops = completion.body.stop_strings
    call = stub.Generate(choice.request)
    try:
        async for response in call:
            choice.num_cached_tokens = response.num_cached_tokens
            choice.num_tokens += len(response.token_ids)
            if choice.logprobs is not None:
                _push_with_logprobs(completion, choice, response)
            else:
                choice.text += choice.detokenizer.push(list(response.token_ids))
            if response.finish_reason:
                if response.finish_reason == "error":
                    raise APIError(500, response.message or "the worker failed this request")
                choice.text += choice.detokenizer.flush()
                choice.finish_reason = "length" if response.finish_reason == "length" else "stop"
            if stops and _cut_at_stop(choice, stops):
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


def _push_with_logprobs(completion: Completion, choice: Choice,
                        response: frontend_pb2.GenerateResponse) -> None:
    """Token by token, so each token's text offset is known."""
    tokenizer = completion.model.tokenizer
    assert choice.logprobs is not None
    for token, entry in zip(response.token_ids, response.logprobs, strict=True):
        offset = len(choice.text)
        choice.text += choice.detokenizer.push([token])
        top = {tokenizer.decode([t.token_id], skip_special_tokens=False): t.logprob
               for t in entry.top} if completion.body.logprobs else None
        choice.logprobs.add(tokenizer.decode([token], skip_special_tokens=False), entry, offset,
                            top)


def _cut_at_stop(choice: Choice, stops: list[str]) -> bool:
    window_start = max(0, choice.sent - max(len(s) for s in stops))
    hits = [i for s in stops if (i := choice.text.find(s, window_start)) != -1]
    if not hits:
        return False
    choice.text = choice.text[:min(hits)]
    return True


async def merged(streams: list[AsyncIterator[None]],
                 choices: list[Choice]) -> AsyncIterator[Choice]:
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
    delta = choice.text[choice.sent:end]
    choice.sent = end
    return delta


def echo_prefix(completion: Completion, choice: Choice) -> str:
    if not completion.body.echo:
        return ""
    prompt = completion.prompts[choice.prompt_index]
    return completion.model.tokenizer.decode(prompt, skip_special_tokens=True)
