"""One generating request's calls: a Generate stream per choice, survived across a broken
scheduler link by continuations, and the choices merged into one stream of changes. Completions
and chat both run their choices here and differ only in how they render a choice
(routes/completions.py, routes/chat.py); the state is server/choice.py, the intake of each
response server/intake.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from protos import frontend_pb2, frontend_pb2_grpc
from server.choice import Choice, Generation
from server.client import SchedulerClient
from server.errors import APIError, from_grpc, scheduler_unreachable
from server.intake import apply_response
from server.resume import Resumer, admitted, continuation, waiting_for_workers

FINISH_TIMEOUT_SECONDS = 2.0


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
                if apply_response(generation, choice, response):
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
