"""Waiting on a client: work cancelled when it goes away, and server-sent event streams of a
generation's choices, rendered by the endpoint (completion chunks or chat chunks)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from server.choice import Choice
from server.errors import APIError

T = TypeVar("T")


async def drain(events: AsyncIterator[object]) -> None:
    async for _ in events:
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Runs work; a client that goes away cancels it (which aborts its requests).

    The client's leaving is awaited, not polled: once the body is read, the next message the
    server delivers is `http.disconnect` (a queued request used to wake every 50 ms to ask, and
    hundreds of them took most of a core; docs/performance.md, "Frontend under large
    requests"). Whatever way this returns, the work
    has finished: a cancelled task is waited for, so that it has left (and cleaned up) any
    generator it was running before the caller goes on, perhaps to close that generator."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        await _cancel_and_wait(task)
        raise APIError(499, "client disconnected")
    finally:
        if not gone.done():
            gone.cancel()
        if not task.done():
            await _cancel_and_wait(task)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone: the server's next message after the body."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel_and_wait(task: asyncio.Future) -> None:
    """Cancels the task and waits until it is done; its outcome is dropped (asyncio.wait
    never raises it), while a cancellation of the caller itself still propagates."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: a failure while it was being cancelled is not logged


def event(chunk: BaseModel | dict, exclude: set[str] | None = None) -> str:
    if isinstance(chunk, BaseModel):
        return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"
    return f"data: {json.dumps(chunk)}\n\n"


def openai_error(err: APIError) -> str:
    return event(err.body())


async def sse_response(
    request: Request,
    events: AsyncIterator[Choice],
    render: Callable[[Choice], list[str]],
    tail: Callable[[], list[str]],
    error: Callable[[APIError], str] = openai_error,
    done: str | None = "data: [DONE]\n\n",
    finish: Callable[[], Awaitable[None]] | None = None,
) -> Response:
    """Streams `render(choice)` for each change of a choice, then `tail()`, then `done`
    (OpenAI's `[DONE]`; Anthropic's and the Responses API's streams end with their last
    event, `done` None). `finish`, if given, is awaited once the events are over and before
    `tail()` (the Responses API stores its response there, before its last event says so).

    The first event is awaited before the response starts, so that errors (a bad prompt, no
    worker) still get a status code, while a client that leaves before it (queued, or in a
    long prefill) is noticed. An error later is sent as the event `error` writes (OpenAI's
    error shape unless told)."""
    try:
        first = await until_disconnect(request, anext(events))
    except StopAsyncIteration:
        first = None
    except BaseException:
        await events.aclose()
        raise

    async def sse() -> AsyncIterator[str]:
        try:
            if first is not None:
                for out in render(first):
                    yield out
                async for choice in events:
                    for out in render(choice):
                        yield out
            if finish is not None:
                await finish()
            for out in tail():
                yield out
        except APIError as err:
            yield error(err)
        finally:
            await events.aclose()
        if done is not None:
            yield done

    return StreamingResponse(
        sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
