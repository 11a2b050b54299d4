"""server/generation.run_choice across broken scheduler links, with a scripted stub at the
edge: what reaches the client, what is re-submitted, and how a resumption ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from kvledger.rpc import ADMITTED
from protos import frontend_pb2
from server.choice import Choice, Generation
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError
from server.generation import run_choice


class Ids:
    """A tokenizer stand-in: token i reads "<i>"."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


def error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details)


BROKEN = error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
NOT_YET = error(grpc.StatusCode.NOT_FOUND, "model 'm' does not exist")


class Call:
    def __init__(self, tokens: list[list[int]], admitted: bool = True, end=None) -> None:  # noqa: ANN001
        self.tokens, self.admitted, self.end = tokens, admitted, end
        self.cancelled = False

    async def initial_metadata(self) -> Metadata:
        return Metadata(ADMITTED) if self.admitted else Metadata()

    def __aiter__(self) -> AsyncIterator[frontend_pb2.GenerateResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[frontend_pb2.GenerateResponse]:
        for i, ids in enumerate(self.tokens):
            last = i == len(self.tokens) - 1 and self.end == "length"
            yield frontend_pb2.GenerateResponse(
                token_ids=ids, num_cached_tokens=7, finish_reason="length" if last else ""
            )
        if isinstance(self.end, AioRpcError):
            raise self.end

    def cancel(self) -> None:
        self.cancelled = True


class Client:
    def __init__(self, calls: list[Call], timeout: float = 5.0) -> None:
        self.calls, self.reconnect_timeout = calls, timeout
        self.requests: list[frontend_pb2.GenerateRequest] = []
        self.outcomes: list[str] = []
        self.aborted: list[tuple[str, str]] = []
        self.stub = self

    def Generate(self, request: frontend_pb2.GenerateRequest) -> Call:  # noqa: N802
        self.requests.append(request)
        return self.calls.pop(0)

    def count_resumption(self, outcome: str) -> None:
        self.outcomes.append(outcome)

    async def Abort(self, request: frontend_pb2.AbortRequest, timeout: float):  # noqa: ANN201, N802
        self.aborted.append((request.request_id, request.reason))
        return frontend_pb2.AbortResponse(aborted=False)


def run(
    client: Client, max_tokens: int = 4, stops: list[str] | None = None
) -> tuple[Choice, BaseException | None]:
    request = frontend_pb2.GenerateRequest(
        request_id="r", model="m", prompt_token_ids=[1, 2], stop={"max_tokens": max_tokens}
    )
    choice = Choice(0, 0, request, IncrementalDetokenizer(Ids(), [1, 2]))
    generation = Generation("cmpl", None, [[1, 2]], stops or [], [choice])  # type: ignore[arg-type]

    async def drive() -> BaseException | None:
        try:
            async for _ in run_choice(client, generation, choice):  # type: ignore[arg-type]
                pass
        except APIError as err:
            return err
        return None

    return choice, asyncio.run(drive())


def test_a_broken_link_is_resumed_with_the_streamed_tokens_and_nothing_repeats():
    client = Client(
        [
            Call([[10], [11]], end=BROKEN),
            Call([], admitted=False, end=NOT_YET),
            Call([[12], [13]], end="length"),
        ]
    )
    choice, err = run(client)
    assert err is None and choice.finish_reason == "length"
    assert choice.token_ids == [10, 11, 12, 13] and choice.text == "<10><11><12><13>"
    assert list(client.requests[1].resumed_token_ids) == [10, 11]
    assert client.requests[2].request_id == "r-resume2"
    assert client.outcomes == ["resumed"]
    assert choice.num_cached_tokens == 7  # the first admission's
    # the attempt whose link broke is ended, in case its scheduler still runs it
    assert client.aborted == [("r", "abort")]


def test_a_scheduler_that_cannot_resume_sends_nothing_to_the_client():
    # A scheduler without continuations ignores resumed_token_ids: it would start over.
    client = Client([Call([[10]], end=BROKEN), Call([[10], [11], [12]], admitted=False)])
    choice, err = run(client)
    assert isinstance(err, APIError) and err.status == 503
    assert choice.token_ids == [10]
    assert client.outcomes == ["gave_up"]


def test_giving_up_while_the_model_has_no_worker_yet_is_503_not_404():
    client = Client(
        [Call([[10]], end=BROKEN)] + [Call([], admitted=False, end=NOT_YET) for _ in range(100)],
        0.3,
    )
    choice, err = run(client)
    assert isinstance(err, APIError) and err.status == 503, err
    assert client.outcomes == ["gave_up"]


def test_a_request_never_admitted_fails_at_once():
    client = Client([Call([], admitted=False, end=BROKEN)])
    _, err = run(client)
    assert isinstance(err, APIError) and err.status == 503
    assert len(client.requests) == 1 and client.outcomes == []


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED]
)
def test_a_refusal_while_resuming_is_said_as_it_is(code):
    client = Client([Call([[10]], end=BROKEN), Call([], admitted=False, end=error(code, "no"))])
    _, err = run(client)
    assert isinstance(err, APIError) and err.status in (400, 429)
    assert client.outcomes == ["gave_up"]


def test_a_stop_string_inside_a_several_token_response_ends_the_count_where_it_ends_the_text():
    """A bundle's tokens come in one response: those after the token that completes the stop
    string are neither shown nor counted, and the scheduler is told the request finished."""
    client = Client([Call([[10, 11, 12], [13]])])
    choice, err = run(client, max_tokens=8, stops=["<11>"])
    assert err is None and choice.finish_reason == "stop"
    assert choice.text == "<10>" and choice.token_ids == [10, 11]
    assert client.aborted == [("r", "stop")]


def test_a_stop_string_in_the_last_response_of_a_finished_request_tells_the_scheduler_nothing():
    client = Client([Call([[10, 11, 12, 13]], end="length")])
    choice, err = run(client, max_tokens=4, stops=["<11>"])
    assert err is None and choice.finish_reason == "stop"
    assert choice.text == "<10>" and choice.token_ids == [10, 11]
    assert client.aborted == []


def test_several_token_responses_without_stop_strings_are_taken_whole():
    client = Client([Call([[10, 11], [12, 13]], end="length")])
    choice, err = run(client)
    assert err is None and choice.finish_reason == "length"
    assert choice.text == "<10><11><12><13>" and choice.token_ids == [10, 11, 12, 13]
