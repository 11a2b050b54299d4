"""Chat and model-catalogue edges that need control over the model directories or the order in
which workers register: the frontend in this process, over a real scheduler service and worker
links whose model is a stand-in (tests/e2e/stand_in.py)."""

from __future__ import annotations

import asyncio
import shutil

from server.app import Settings
from tests.e2e.helpers import with_app
from tests.e2e.stand_in import EMBED, GENERATE, TINY_LLAMA_VOCAB, stand_in_worker
from tests.service.helpers import wait_for

USER = [{"role": "user", "content": "Hi there"}]


def test_generative_models_are_listed_first(scheduler, model_dir):
    """Clients that take the first model must get one that generates, whatever the order in
    which workers registered."""
    with stand_in_worker(scheduler.target, "a-embedder", model_dir, kind=EMBED, **TINY_LLAMA_VOCAB):
        wait_for(lambda: len(scheduler.engine.links) == 1)
        with stand_in_worker(
            scheduler.target, "z-generator", model_dir, kind=GENERATE, **TINY_LLAMA_VOCAB
        ):
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
    with stand_in_worker(scheduler.target, "m", model_dir, kind=GENERATE, **TINY_LLAMA_VOCAB):
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
    with stand_in_worker(
        scheduler.target,
        "g",
        str(tmp_path / "gone.gguf"),
        kind=GENERATE,
        tokenizer_path=model_dir,
        **TINY_LLAMA_VOCAB,
    ):
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
    with stand_in_worker(scheduler.target, "bare", str(bare), kind=GENERATE, **TINY_LLAMA_VOCAB):
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
