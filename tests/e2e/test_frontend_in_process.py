"""The frontend app in this process, over a real scheduler service (gRPC on loopback) and worker
links whose model is a stand-in (tests/e2e/stand_in.py): the edges that need control over the
worker: a step that never returns, a stop string, logprobs no model would give."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import grpc
import pytest

from protos import frontend_pb2, frontend_pb2_grpc
from server.app import Settings
from tests.e2e.helpers import with_app
from tests.e2e.stand_in import stand_in_worker
from tests.service.helpers import (
    PositionRunner,
    ledger_idle,
    wait_for,
)
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample, TokenLogprobs


def finished(scheduler, reason: str) -> float:  # noqa: ANN001
    """The scheduler's kvledger_requests_finished_total{reason}, summed over models."""
    return sum(
        sample.value
        for family in scheduler.engine.registry.collect()
        if family.name == "kvledger_requests_finished"
        for sample in family.samples
        if sample.name == "kvledger_requests_finished_total" and sample.labels["reason"] == reason
    )


def strict_json(text: str):  # noqa: ANN201
    """json.loads that refuses NaN and Infinity, as a browser's JSON.parse does."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# ---- a streaming client that leaves before the first token ----


class HangingRunner(PositionRunner):
    """A step that does not return until released: a long prefill, a queue."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.started.set()
        self.release.wait(10)
        return super().execute(chunks)


async def call_and_leave(app, body: dict, leave: asyncio.Event) -> tuple[object, list]:  # noqa: ANN001
    """One raw ASGI request whose client disconnects once `leave` is set."""
    sent = False
    messages: list = []

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    try:
        await asyncio.wait_for(app(scope, receive, send), 10)
    except Exception as err:  # noqa: BLE001 - the assertion reports it
        return err, messages
    return None, messages


def test_a_stream_left_before_its_first_token_is_a_clean_499_and_aborted(scheduler, model_dir):
    runner = HangingRunner()
    with stand_in_worker(scheduler.target, "m", model_dir, runner):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            leave = asyncio.Event()
            request = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5, "stream": True}
            pending = asyncio.create_task(call_and_leave(app, request, leave))
            await asyncio.to_thread(runner.started.wait, 10)  # the worker holds it mid-step
            leave.set()
            error, messages = await pending
            # Aborted in the scheduler while the worker's step still runs; once the step
            # returns, its ledger holds nothing.
            await asyncio.to_thread(wait_for, lambda: not scheduler.engine.requests)
            runner.release.set()
            await asyncio.to_thread(wait_for, lambda: ledger_idle(scheduler))
            metrics = (await http.get("/metrics")).text
            return error, messages, metrics

        try:
            error, messages, metrics = asyncio.run(
                with_app(Settings(scheduler=scheduler.target), body)
            )
        finally:
            runner.release.set()
    assert error is None, f"the endpoint raised {error!r}"
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 499
    counted = [
        line for line in metrics.splitlines() if line.startswith("kvledger_http_requests_total")
    ]
    assert counted == ['kvledger_http_requests_total{route="/v1/completions",status="499"} 1.0']
    assert finished(scheduler, "abort") == 1


# ---- a stop string ends a request the scheduler still runs ----


class HeldRunner(PositionRunner):
    """Holds every step past position HELD_FROM until released: the request outlives the
    moment the frontend sees its stop string (in its first 33 positions) however late that is."""

    HELD_FROM = 48

    def __init__(self) -> None:
        self.release = threading.Event()

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        if any(c.start_pos >= self.HELD_FROM for c in chunks):
            assert self.release.wait(60)
        return super().execute(chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_finish_is_counted_as_stop_not_abort(scheduler, model_dir, stream):
    runner = HeldRunner()
    with stand_in_worker(scheduler.target, "m", model_dir, runner):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            request = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 30, "ignore_eos": True}
            full = (await http.post("/v1/completions", json=request)).json()
            text = full["choices"][0]["text"]
            stop = text[len(text) // 2 : len(text) // 2 + 3]
            # held short of its 200 tokens when the stop string shows: the frontend ends it
            longer = {**request, "max_tokens": 200, "stop": [stop], "stream": stream}
            try:
                reply = await http.post("/v1/completions", json=longer)
            finally:
                runner.release.set()
            return text, stop, reply

        text, stop, reply = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    assert reply.status_code == 200
    if stream:
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events[:-1]]
        cut = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        cut = reply.json()["choices"][0]["text"]
        finish = reply.json()["choices"][0]["finish_reason"]
    assert finish == "stop" and cut == text[: text.index(stop)], (text, stop, cut)
    wait_for(lambda: ledger_idle(scheduler))
    # The first request finished on its length, the second on its stop string.
    assert (finished(scheduler, "length"), finished(scheduler, "stop")) == (1, 1)
    assert finished(scheduler, "abort") == 0


def test_abort_with_an_unknown_reason_is_refused(scheduler):
    async def call() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(scheduler.target) as channel:
            stub = frontend_pb2_grpc.SchedulerStub(channel)
            try:
                await stub.Abort(frontend_pb2.AbortRequest(request_id="x", reason="bored"))
            except grpc.aio.AioRpcError as err:
                return err.code()
            return grpc.StatusCode.OK

    assert asyncio.run(call()) == grpc.StatusCode.INVALID_ARGUMENT


# ---- logprobs JSON cannot carry ----


class OffScaleLogprobsRunner(PositionRunner):
    """Logprobs as the sampler reports them for logits spread beyond float32's range: -inf
    for the sampled token and an alternative; and a NaN no sampler gives."""

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        out: list[Sample | None] = []
        for chunk, sample in zip(chunks, super().execute(chunks), strict=True):
            if sample is None or chunk.sampling.logprobs < 0:
                out.append(sample)
                continue
            top = TokenLogprobs(-math.inf, [500, 501, 502], [-0.5, -math.inf, math.nan])
            out.append(Sample(sample.token_id, logprobs=top))
        return out


def test_infinite_logprobs_are_clamped_as_vllm_does(scheduler, model_dir):
    with stand_in_worker(scheduler.target, "m", model_dir, OffScaleLogprobsRunner()):
        wait_for(lambda: len(scheduler.engine.links) == 1)
        request = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 3}

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            whole = await http.post("/v1/completions", json=request)
            streamed = await http.post("/v1/completions", json={**request, "stream": True})
            return whole, streamed

        whole, streamed = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    assert whole.status_code == 200, whole.text
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    bodies = [strict_json(whole.text)["choices"][0]["logprobs"]]
    bodies += [strict_json(e)["choices"][0]["logprobs"] for e in events[:-1]]
    token_logprobs = [v for b in bodies for v in b["token_logprobs"]]
    tops = [t for b in bodies for t in b["top_logprobs"]]
    assert token_logprobs == [-9999.0] * 6  # three tokens, whole and streamed
    assert len(tops) == 6
    for top in tops:  # the NaN alternative is left out: the values are numbers
        # two alternatives, and the sampled token (a position token, none of them)
        assert sorted(top.values()) == [-9999.0, -9999.0, -0.5]
