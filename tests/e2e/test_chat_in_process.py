"""Chat and model-catalogue edges that need control over the model directories or the order in
which workers register: the frontend in this process, over a real scheduler service and worker
links whose model is a stand-in (as in test_frontend_in_process)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from collections.abc import Iterator

import pytest

from kvledger.models import resolve_model
from protos import frontend_pb2, worker_pb2
from server.app import Settings
from tests.e2e.helpers import with_app
from tests.service.helpers import PositionRunner, limits_of, wait_for
from worker.executor import Executor
from worker.link import WorkerLinkClient
from worker.metrics import WorkerMetrics

USER = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(resolve_model("tiny-llama"))


@contextlib.contextmanager
def worker(
    target: str, model: str, path: str, kind: int, tokenizer_path: str = ""
) -> Iterator[None]:
    reg = worker_pb2.Registration(
        worker_id=f"w-{model}", model_name=model, model_path=path, kind=kind, block_size=4,
        num_blocks=64, max_model_len=256, vocab_size=30522, eos_token_ids=[102],
        tokenizer_path=tokenizer_path,
    )  # fmt: skip
    runner = PositionRunner()
    runner.limits = limits_of(reg)
    link = WorkerLinkClient(target, reg, Executor(runner), WorkerMetrics(model, reg.worker_id))
    thread = threading.Thread(target=link.run_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        link.stop()
        thread.join(5)


GENERATE, EMBED = frontend_pb2.MODEL_KIND_GENERATE, frontend_pb2.MODEL_KIND_EMBED


def test_generative_models_are_listed_first(scheduler, model_dir):
    """Clients that take the first model must get one that generates, whatever the order in
    which workers registered."""
    with worker(scheduler.target, "a-embedder", model_dir, EMBED):
        wait_for(lambda: len(scheduler.engine.links) == 1)
        with worker(scheduler.target, "z-generator", model_dir, GENERATE):
            wait_for(lambda: len(scheduler.engine.links) == 2)

            async def body(app, http):  # noqa: ANN001, ANN202
                del app
                return (await http.get("/v1/models")).json()

            listed = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    assert [m["id"] for m in listed["data"]] == ["z-generator", "a-embedder"]
    assert [m["root"] for m in listed["data"]] == ["z-generator", "a-embedder"]


def test_chat_template_flag_replaces_the_models_own(scheduler, model_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    with worker(scheduler.target, "m", model_dir, GENERATE):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            request = {"model": "m", "messages": USER, "return_token_strs": True}
            tokens = (await http.post("/tokenize", json=request)).json()
            chat = {"model": "m", "messages": USER, "max_tokens": 2}
            reply = await http.post("/v1/chat/completions", json=chat)
            return tokens, reply

        for source in (str(template), template.read_text()):  # a file, or the text itself
            settings = Settings(scheduler=scheduler.target, chat_template=source)
            tokens, reply = asyncio.run(with_app(settings, body))
            assert tokens["token_strs"] == ["<", "user", ">", "hi", "there"]
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] == 5


def test_tokenizer_flag_replaces_the_models_own(scheduler, model_dir, tmp_path):
    """--tokenizer DIR: the frontend reads tokenizer and chat template there, not from the
    model's path (here a GGUF file it could not read at all)."""
    with worker(scheduler.target, "g", str(tmp_path / "gone.gguf"), GENERATE, model_dir):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            prompt = {"model": "g", "prompt": "hello there", "return_token_strs": True}
            chat = {"model": "g", "messages": USER, "return_token_strs": True}
            return [(await http.post("/tokenize", json=r)).json() for r in (prompt, chat)]

        plain, chat = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    assert plain["token_strs"] == ["[CLS]", "hello", "there"]
    assert chat["token_strs"][:3] == ["[CLS]", "user", ":"]  # tiny-llama's chat template


def test_a_model_without_a_template_is_400_naming_the_flag(scheduler, model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(f"{model_dir}/tokenizer.json", bare / "tokenizer.json")
    with worker(scheduler.target, "bare", str(bare), GENERATE):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            chat = {"model": "bare", "messages": USER}
            plain = {"model": "bare", "prompt": "x", "max_tokens": 1}
            return (
                await http.post("/v1/chat/completions", json=chat),
                await http.post("/v1/completions", json=plain),
            )

        chat, plain = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    assert chat.status_code == 400
    error = chat.json()["error"]
    assert "--chat-template" in error["message"] and error["param"] == "messages"
    assert str(bare) not in error["message"]
    assert plain.status_code == 200, plain.text
