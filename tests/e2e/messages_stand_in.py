"""What the in-process /v1/messages tests share (test_messages_in_process.py,
test_messages_errors.py): a stand-in worker that writes a scripted reply in SmolLM2's tokens
(its GGUF file's tokenizer and ChatML template), the app over it with an httpx and an
`anthropic` client, and a stream's events read back."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx2
from httpx import ASGITransport, AsyncClient

from kvledger.gguf_tokenizer import load_gguf_tokenizer
from kvledger.models import smollm2_path
from server.app import Settings, build_app
from tests.e2e.stand_in import stand_in_worker
from tests.service.helpers import PositionRunner, ledger_idle, wait_for
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sample

EOS = 2  # <|im_end|>
MODEL = "s"
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL_TAG = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HELLO = "Hello there, friend."


class ScriptedRunner(PositionRunner):
    """Writes the token ids of its script (the same reply to every request), then EOS; keeps
    each request's prompt."""

    def __init__(self, script: str) -> None:
        self.script = encode(script)
        self.prompts: list[list[int]] = []

    def constraint(self, spec: object) -> None:
        """No grammar masks the script (the frontend still compiled the request's)."""
        del spec

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        out: list[Sample | None] = []
        for chunk in chunks:
            if not chunk.sample:
                out.append(None)
                continue
            step = chunk.end_pos - chunk.num_prompt_tokens
            if step == 0:
                self.prompts.append(list(chunk.all_token_ids[: chunk.num_prompt_tokens]))
            out.append(Sample(self.script[step] if step < len(self.script) else EOS))
        return out


def encode(text: str) -> list[int]:
    return (
        load_gguf_tokenizer(str(smollm2_path()))
        .tokenizer.encode(text, add_special_tokens=False)
        .ids
    )


def decode(ids: list[int]) -> str:
    return load_gguf_tokenizer(str(smollm2_path())).tokenizer.decode(ids, skip_special_tokens=False)


def anthropic_client(http_client):  # noqa: ANN001, ANN201
    return anthropic.AsyncAnthropic(
        base_url="http://t", api_key="k", http_client=http_client, max_retries=0
    )


def serve(scheduler, runner, requests, sdk=anthropic_client, **settings):  # noqa: ANN001, ANN003, ANN201
    """`requests(http, client)` against the app, its model the scripted stand-in, `client`
    the SDK `sdk` makes over the app (Anthropic's unless told); the ledger is idle after it."""
    path = str(smollm2_path())
    with stand_in_worker(
        scheduler.target, MODEL, path, runner, vocab_size=49152, eos_token_ids=(EOS,),
        max_model_len=1024, num_blocks=1024,
    ):  # fmt: skip
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def run():  # noqa: ANN202
            app = build_app(Settings(scheduler=scheduler.target, **settings))
            async with app.router.lifespan_context(app):
                transport = ASGITransport(app, raise_app_exceptions=False)
                # the SDK clients speak httpx2 (a fork of httpx): its own transport
                sdk_http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app), timeout=60)
                client = sdk(sdk_http)
                async with AsyncClient(transport=transport, base_url="http://t", timeout=60) as h:
                    return await requests(h, client)

        result = asyncio.run(run())
        wait_for(lambda: ledger_idle(scheduler))
    return result


def events_of(text: str) -> list[tuple[str, dict]]:
    """A stream's (event name, data) pairs; each event's name is its data's type."""
    out = []
    for chunk in text.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out
