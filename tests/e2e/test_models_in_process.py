"""The model catalogue as the frontend sees it, in this process over a real scheduler service and
stand-in workers (tests/e2e/stand_in.py): a model whose tokenizer cannot be loaded answers 503
while the others serve, /health says whether the required models can be served, and a model
served before a scheduler restart is 503 until its worker is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from server import client as client_module
from server.app import Settings
from tests.e2e.helpers import with_app
from tests.e2e.stand_in import stand_in_worker
from tests.service.helpers import running_scheduler, wait_for
from tests.serving import free_port

UNREADABLE = "/nonexistent/model-dir"


# ---- one model whose tokenizer cannot be loaded ----


def test_an_unloadable_model_answers_503_and_the_others_keep_serving(
    scheduler, model_dir, monkeypatch, caplog
):
    # Retried on every catalogue refresh here: it is still logged once.
    monkeypatch.setattr(client_module, "TOKENIZER_RETRY_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="server.client")
    with (
        stand_in_worker(scheduler.target, "good", model_dir),
        stand_in_worker(scheduler.target, "bad", UNREADABLE),
    ):
        wait_for(lambda: len(scheduler.engine.links) == 2)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            good = {"model": "good", "prompt": [1, 2, 3], "max_tokens": 2}
            replies = []
            for _ in range(3):
                replies.append(await http.post("/v1/completions", json=good))
                replies.append(await http.post("/v1/completions", json={**good, "model": "bad"}))
                replies.append(await http.post("/tokenize", json={"model": "bad", "prompt": "x"}))
                replies.append(await http.get("/health"))
            models = (await http.get("/v1/models")).json()
            return replies, models

        replies, models = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    for completion, bad, tokenize, health in zip(*[iter(replies)] * 4, strict=True):
        assert completion.status_code == 200, completion.text
        assert health.status_code == 200
        for reply in (bad, tokenize):
            assert reply.status_code == 503, reply.text
            assert reply.headers["retry-after"]
            error = reply.json()["error"]
            assert error["type"] == "service_unavailable"
            assert error["param"] == "model" and error["code"] == "model_unavailable"
            assert "`bad`" in error["message"] and "tokenizer" in error["message"]
            assert UNREADABLE not in error["message"]  # paths stay in the operator's log
    assert [m["id"] for m in models["data"]] == ["good"]
    # the frontend's client's errors only: a gRPC server of an earlier test collected in the
    # middle of this one logs its pending tasks under `asyncio` and `grpc`
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "server.client"]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert "bad" in logged[0].getMessage() and UNREADABLE in logged[0].getMessage()


def test_health_is_503_when_a_required_model_cannot_be_loaded(scheduler, model_dir):
    with (
        stand_in_worker(scheduler.target, "good", model_dir),
        stand_in_worker(scheduler.target, "bad", UNREADABLE),
    ):
        wait_for(lambda: len(scheduler.engine.links) == 2)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            return (await http.get("/health")).status_code

        for required, expected in ((["good"], 200), (["good", "bad"], 503)):
            settings = Settings(scheduler=scheduler.target, require_model=required)
            assert asyncio.run(with_app(settings, body)) == expected, required


def test_health_is_503_when_no_model_can_be_loaded(scheduler):
    with stand_in_worker(scheduler.target, "bad", UNREADABLE):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            return (await http.get("/health")).status_code

        assert asyncio.run(with_app(Settings(scheduler=scheduler.target), body)) == 503


# ---- a scheduler restart: the models come back a moment later ----


def test_a_model_served_before_a_scheduler_restart_is_503_until_its_worker_is_back(model_dir):
    port = free_port()
    target = f"127.0.0.1:{port}"
    request = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}

    async def body(app, http):  # noqa: ANN001, ANN202
        del app
        # (the scheduler starts its own event loop: in a thread, off the test's)
        with contextlib.ExitStack() as first:
            handle = await asyncio.to_thread(first.enter_context, running_scheduler(port=port))
            await asyncio.to_thread(first.enter_context, stand_in_worker(target, "m", model_dir))
            await asyncio.to_thread(wait_for, lambda: len(handle.engine.links) == 1)
            before = await http.post("/v1/completions", json=request)
            await asyncio.to_thread(first.close)
        # A new scheduler on the same address: it has never heard of "m"
        with contextlib.ExitStack() as second:
            await asyncio.to_thread(second.enter_context, running_scheduler(port=port))
            await asyncio.sleep(client_module.CATALOG_TTL_SECONDS + 0.1)
            during = await http.post("/v1/completions", json=request)
            unknown = await http.post("/v1/completions", json={**request, "model": "never"})
            await asyncio.to_thread(second.close)
        return before, during, unknown

    before, during, unknown = asyncio.run(with_app(Settings(scheduler=target), body))
    assert before.status_code == 200, before.text
    assert during.status_code == 503, during.text
    assert during.headers["retry-after"]
    assert unknown.status_code == 404, unknown.text
