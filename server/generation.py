"""One generating request, endpoint-neutral: a Generate stream per choice, detokenized, with
stop strings cut and logprob entries recorded. Completions and chat both run their choices here
and differ only in how they render a choice (routes/completions.py, routes/chat.py)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from protos import frontend_pb2, frontend_pb2_grpc
from server.client import SchedulerClient, ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError, from_grpc, scheduler_unreachable
from server.responses import PromptTokensDetails, Usage
from server.resume import Resumer, admitted, continuation, waiting_for_workers

FINISH_TIMEOUT_SECONDS = 2.0
LOGPROB_FLOOR = -9999.0  # vLLM's: JSON has no -inf


def json_logprob(value: float) -> float | None:
    """A logprob as JSON can carry it, as vLLM does: -inf (a token the model gives no chance,
    or logits spread beyond float32) is clamped to -9999.0; NaN (the scheduler's mark for a
    logprob the worker did not send) and +inf (never a logprob) are null."""
    if math.isnan(value) or value == math.inf:
        return None
    return max(value, LOGPROB_FLOOR)


@dataclass(frozen=True)
class TokenEntry:
    """A token with its logprob and the top alternatives (those JSON can carry a number for);
    `offset` is where its text starts in the choice's text (-1 for a prompt token)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    offset: int = -1

    @classmethod
    def of(cls, entry: frontend_pb2.TokenLogprob, offset: int = -1) -> TokenEntry:
        top = tuple(
            (t.token_id, lp) for t in entry.top if (lp := json_logprob(t.logprob)) is not None
        )
        return cls(entry.token_id, json_logprob(entry.logprob), top, offset)


@dataclass
class Choice:
    index: int
    prompt_index: int
    request: frontend_pb2.GenerateRequest
    detokenizer: IncrementalDetokenizer
    text: str = ""
    sent: int = 0  # characters of text already streamed
    started: bool = False  # streaming: its first chunk went out
    closed: bool = False  # streaming: the chunk with the finish reason went out
    # max_tokens 0 with echo (OpenAI's way to score a prompt alone): the one token generated
    # to end the request is dropped.
    echo_only: bool = False
    token_ids: list[int] = field(default_factory=list)  # generated so far (usage, continuations)
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    entries: list[TokenEntry] | None = None  # with logprobs: one per generated token
    entries_sent: int = 0
    # With prompt logprobs: one per prompt token once the first response came (the first None).
    prompt_entries: list[TokenEntry | None] | None = None

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.request.sampling.HasField("prompt_logprobs")

    def take_entries(self) -> list[TokenEntry]:
        """Streaming: the entries whose text has started going out (all of them at the end),
        so a stop string that later cuts the text never leaves a streamed token behind."""
        if self.entries is None:
            return []
        if self.finish_reason is not None:
            end = len(self.entries)
        else:
            end = sum(1 for e in self.entries if e.offset < self.sent)
        start, self.entries_sent = self.entries_sent, max(self.entries_sent, end)
        return self.entries[start : self.entries_sent]


@dataclass
class Generation:
    id: str
    model: ServedModel
    prompts: list[list[int]]
    stops: list[str]
    choices: list[Choice] = field(default_factory=list)
    # include_stop_str_in_output: a stop string ends the text instead of being cut off
    include_stop: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def holdback(self) -> int:
        """Characters a stream keeps back: a stop string may still be forming in them."""
        return max(max((len(s) for s in self.stops), default=0) - 1, 0)

    def usage(self) -> Usage:
        prompt_tokens = sum(len(p) for p in self.prompts)
        completion_tokens = sum(len(c.token_ids) for c in self.choices)
        cached = [0] * len(self.prompts)
        for c in self.choices:
            cached[c.prompt_index] = max(cached[c.prompt_index], c.num_cached_tokens)
        return Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached)),
        )


async def run_choice(
    client: SchedulerClient, generation: Generation, choice: Choice
) -> AsyncIterator[None]:
    """Drives one choice; yields each time its text or finish reason changed. A broken link to
    the scheduler is survived by re-submitting the request as a continuation (server/resume.py)."""
    resumer = Resumer(client.reconnect_timeout)
    request = choice.request
    heard = False  # a response came: usage keeps the first one's cache hit
    live_id = request.request_id  # the id the scheduler last admitted
    while True:
        call = client.stub.Generate(request)
        try:
            if not resumer.resuming:
                resumer.admitted |= await admitted(call)
            elif await _admitted_in_time(call, resumer, client):
                client.count_resumption("resumed")
                resumer.resumed()
                # After a network break (not a restart) the old scheduler may still run the
                # previous attempt until its keepalive notices: end it now.
                await _finish_early(client.stub, live_id, reason="abort")
                live_id = request.request_id
            else:
                await _refused(call, client)  # raises: the call's error, or a 503
            async for response in call:
                if not heard:
                    choice.num_cached_tokens, heard = response.num_cached_tokens, True
                if _apply(generation, choice, response):
                    await _finish_early(client.stub, request.request_id)
                yield
                if choice.finish_reason is not None:
                    return
            return
        except grpc.aio.AioRpcError as err:
            delay = resumer.retry_after(err)
            if delay is None:
                if not resumer.resuming:
                    raise from_grpc(err) from None
                client.count_resumption("gave_up")
                if scheduler_unreachable(err) or waiting_for_workers(err):
                    raise _gave_up(resumer) from None
                raise from_grpc(err) from None  # refused (e.g. 400): said as it is
        finally:
            call.cancel()  # no-op when finished; aborts the request when we stop early
        await asyncio.sleep(delay)
        request = continuation(
            choice.request, choice.token_ids, resumer.attempts, choice.prompt_entries is not None
        )


def _gave_up(resumer: Resumer) -> APIError:
    return APIError(
        503, f"the scheduler did not come back within {resumer.timeout:g} s; retry later"
    )


async def _admitted_in_time(
    call: grpc.aio.UnaryStreamCall, resumer: Resumer, client: SchedulerClient
) -> bool:
    try:
        return await asyncio.wait_for(admitted(call), resumer.time_left())
    except TimeoutError:
        client.count_resumption("gave_up")
        raise _gave_up(resumer) from None


async def _refused(call: grpc.aio.UnaryStreamCall, client: SchedulerClient) -> None:
    """A continuation the scheduler did not admit: its call fails (raising the error, which
    says whether to wait on), unless the scheduler cannot resume at all (one that predates
    continuations ignores `resumed_token_ids` and would generate from the prompt again: none
    of its tokens may reach the client)."""
    async for _ in call:
        break
    client.count_resumption("gave_up")
    raise APIError(503, "the scheduler cannot resume this request (no continuation support)")


def _apply(generation: Generation, choice: Choice, response: frontend_pb2.GenerateResponse) -> bool:
    """Takes one response into the choice; True when a stop string ended a request that the
    scheduler still runs (it must be told).

    A response may carry several tokens (a bundle's, `--num-scheduler-steps`). With stop
    strings they are taken one at a time, so that the tokens after the one that completes a
    stop string are neither shown nor counted in usage, as when each came alone."""
    if not (generation.stops and len(response.token_ids) > 1 and not choice.echo_only):
        return _apply_one(generation, choice, response)
    for part in _one_token_each(response):
        ended_early = _apply_one(generation, choice, part)
        if choice.finish_reason is not None:
            return ended_early and not response.finish_reason
    return False


def _one_token_each(
    response: frontend_pb2.GenerateResponse,
) -> Iterator[frontend_pb2.GenerateResponse]:
    """The response as single-token responses: the prompt logprobs with the first, the finish
    with the last."""
    last = len(response.token_ids) - 1
    for i, token in enumerate(response.token_ids):
        part = frontend_pb2.GenerateResponse(
            token_ids=[token],
            num_prompt_tokens=response.num_prompt_tokens,
            num_cached_tokens=response.num_cached_tokens,
        )
        if response.logprobs:
            part.logprobs.append(response.logprobs[i])
        if i == 0:
            part.prompt_logprobs.extend(response.prompt_logprobs)
        if i == last:
            part.finish_reason, part.message = response.finish_reason, response.message
        yield part


def _apply_one(
    generation: Generation, choice: Choice, response: frontend_pb2.GenerateResponse
) -> bool:
    if choice.wants_prompt_logprobs and choice.prompt_entries is None:
        _add_prompt_entries(generation, choice, response.prompt_logprobs)
    if not choice.echo_only:
        _push(choice, response)
    if response.finish_reason:
        if response.finish_reason == "error":
            raise APIError(500, response.message or "the worker failed this request")
        choice.text += choice.detokenizer.flush()
        length = response.finish_reason == "length" or choice.echo_only
        choice.finish_reason = "length" if length else "stop"
    stops = generation.stops
    if stops and _cut_at_stop(choice, stops, generation.include_stop):
        choice.finish_reason = "stop"
        if choice.entries is not None:
            choice.entries = [e for e in choice.entries if e.offset < len(choice.text)]
        return not response.finish_reason
    return False


async def _finish_early(
    stub: frontend_pb2_grpc.SchedulerStub, request_id: str, reason: str = "stop"
) -> None:
    """A stop string ended a request the scheduler still runs: tell it that the request
    finished (not that its client gave up) before the call is cancelled. If this fails, the
    cancellation still ends the request, counted as an abort."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await stub.Abort(
            frontend_pb2.AbortRequest(request_id=request_id, reason=reason),
            timeout=FINISH_TIMEOUT_SECONDS,
        )


def _push(choice: Choice, response: frontend_pb2.GenerateResponse) -> None:
    choice.token_ids.extend(response.token_ids)
    if choice.entries is None:
        choice.text += choice.detokenizer.push(list(response.token_ids))
        return
    # Token by token, so that each token's text offset is known.
    for token, entry in zip(response.token_ids, response.logprobs, strict=True):
        offset = len(choice.text)
        choice.text += choice.detokenizer.push([token])
        choice.entries.append(TokenEntry.of(entry, offset))


def _add_prompt_entries(
    generation: Generation, choice: Choice, entries: Sequence[frontend_pb2.TokenLogprob]
) -> None:
    """All sent with the first response: the first token has no logprob; one the scheduler
    did not send (a bug signal it logs) has none either."""
    prompt = generation.prompts[choice.prompt_index]
    scored: list[TokenEntry | None] = [None, *(TokenEntry.of(e) for e in entries)]
    choice.prompt_entries = (scored + [None] * len(prompt))[: len(prompt)]


def _cut_at_stop(choice: Choice, stops: list[str], include: bool) -> bool:
    """Cuts the text at its earliest stop string (after it, with `include`); True on a hit."""
    window_start = max(0, choice.sent - max(len(s) for s in stops))
    hits = [(i, len(s)) for s in stops if (i := choice.text.find(s, window_start)) != -1]
    if not hits:
        return False
    at, length = min(hits)
    choice.text = choice.text[: at + length if include else at]
    return True


async def merged(generation: Generation, client: SchedulerClient):  # noqa: ANN201
    """Runs every choice concurrently; yields the choice that changed, as it changes."""
    if len(generation.choices) == 1:
        # One choice (most requests): its stream is read here, with no task and queue between
        # it and the response, which cost a task switch per token.
        (choice,) = generation.choices
        events = run_choice(client, generation, choice)
        try:
            async for _ in events:
                yield choice
        finally:
            await events.aclose()
        return
    queue: asyncio.Queue[tuple[Choice, BaseException | None] | None] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for _ in run_choice(client, generation, choice):
                await queue.put((choice, None))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            await queue.put((choice, err))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(c)) for c in generation.choices]
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
