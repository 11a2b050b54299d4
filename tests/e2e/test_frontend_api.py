"""The OpenAI surface over a live stack started with API keys: prompt forms, n, echo, stops,
tokenize, multibyte streaming, disconnects, and the frontend's memory under maximum prompts.
Auth and tenants, bad requests and fuzzing: the test_frontend_api_*.py modules."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx
import pytest

from tests.e2e.helpers import idle
from tests.e2e.stacks import FRONTEND_API, KEY_A, MODEL
from tests.serving import descendants, metric_sum, scrape, wait_metric

LONG_PROMPT = "a ledger of blocks, exact and counted, " * 8


STACK = FRONTEND_API


def test_prompt_forms_and_n(client):
    tok = client.completions.create(
        model=MODEL, prompt=[101, 2023, 2003], max_tokens=3, temperature=0
    )
    assert tok.usage.prompt_tokens == 3
    multi = client.completions.create(
        model=MODEL, prompt=["one", "two words"], max_tokens=2, temperature=0, n=2
    )
    assert [c.index for c in multi.choices] == [0, 1, 2, 3]
    assert multi.choices[0].text == multi.choices[1].text, "greedy choices agree"
    lists = client.completions.create(
        model=MODEL, prompt=[[101, 2000], [101, 2001, 2002]], max_tokens=1
    )
    assert len(lists.choices) == 2 and lists.usage.prompt_tokens == 5


def test_echo_prepends_the_prompt(client):
    out = client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=3, echo=True, temperature=0
    )
    assert out.choices[0].text.startswith("hello there")


def test_stop_string_cuts_the_text_streaming_and_not(client):
    base = client.completions.create(
        model=MODEL,
        prompt=LONG_PROMPT,
        max_tokens=20,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = base.choices[0].text
    assert len(text) > 6
    stop = text[3:7]  # likely spans a token boundary
    cut = client.completions.create(
        model=MODEL,
        prompt=LONG_PROMPT,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=LONG_PROMPT,
            max_tokens=20,
            temperature=0,
            stop=stop,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == cut.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tokenize_roundtrip(http):
    ids = http.post("/tokenize", json={"model": MODEL, "prompt": "hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) >= 2
    text = http.post("/detokenize", json={"model": MODEL, "tokens": ids["tokens"]}).json()
    assert "hello world" in text["prompt"]
    assert http.post("/detokenize", json={"model": MODEL, "tokens": [10**7]}).status_code == 400


def _raw_request(served, body: dict, path: str = "/v1/completions") -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json".encode()
        + b"\r\nAuthorization: Bearer "
        + KEY_A.encode()
        + f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_releases_blocks_and_tracker(served, stream, chat):
    body = {"model": MODEL, "max_tokens": 1500, "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": LONG_PROMPT}]
        sock = _raw_request(served, body, "/v1/chat/completions")
    else:
        sock = _raw_request(served, {**body, "prompt": LONG_PROMPT})
    metrics = served.scheduler_metrics_url
    aborted = metric_sum(scrape(metrics), "kvledger_requests_finished_total", reason="abort")
    wait_metric(metrics, "kvledger_kv_blocks_in_use", 1)  # the request started
    sock.close()
    assert idle(served), "blocks or tracker entries outlived the client"
    # ended by the disconnect, not by running its 1500 tokens out
    after = metric_sum(scrape(metrics), "kvledger_requests_finished_total", reason="abort")
    assert after == aborted + 1


def test_n_choices_share_the_prompt_blocks(client):
    prompt = "choices share one prompt's blocks in the ledger " * 5
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=2,
        n=3,
        temperature=0,
        extra_body={"cache_salt": "n-test"},
    )
    assert len(out.choices) == 3
    # The first choice computes the prompt; the others hit its full blocks.
    assert out.usage.prompt_tokens_details.cached_tokens >= 16


def test_n_choices_with_a_seed_differ_and_the_response_repeats(client):
    kwargs = dict(
        model=MODEL,
        prompt="seeded choices",
        max_tokens=12,
        temperature=1.0,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    texts = [c.text for c in client.completions.create(n=3, **kwargs).choices]
    assert len(set(texts)) == 3, texts  # each choice draws its own sample (seed + index)
    again = [c.text for c in client.completions.create(n=3, **kwargs).choices]
    assert again == texts
    assert client.completions.create(n=1, **kwargs).choices[0].text == texts[0]


def test_multibyte_text_streams_exactly_as_it_completes(client):
    prompt = "東京 🎉 café naïve — 漢字 and emoji 😀 "
    kwargs = dict(
        model=MODEL,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        echo=True,
        extra_body={"ignore_eos": True},
    )
    full = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == full
    assert "\ufffd" not in full


def _frontend_pid(served) -> int:  # noqa: ANN001
    for pid in descendants(served.process.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        if argv[1:3] == ["-m", "server"]:
            return pid
    raise AssertionError("no frontend process")


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_four_maximum_size_prompts_at_once_cost_the_frontend_little(served):
    """A text that cannot fit the context is refused before it is tokenized (a 4 MB prompt
    took the frontend from 432 MB to 1.3 GB; four at once to 4.2 GB)."""
    pid = _frontend_pid(served)
    before = _peak_rss_mib(pid)
    prompt = "ledger " * 570_000  # ~4 MB, under the 4 MiB body limit

    async def four() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=120) as c:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(4)))

    replies = asyncio.run(four())
    for reply in replies:
        assert reply.status_code == 400, reply.text[:300]
        assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert _peak_rss_mib(pid) - before < 1024
