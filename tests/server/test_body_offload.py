"""Bodies parsed off the event loop (server/body_offload.py) and large ones screened in a child
process first (server/body_screen.py): the same values and the same errors as FastAPI's own
parsing, lists counted and values bounded before validation, a body nested past Python's
recursion limit, or not UTF-8, a 400 saying so; a child that dies is replaced."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.exceptions import RequestValidationError

from kvledger.config.frontend import Limits
from server.body_offload import parsed
from server.body_screen import SCREEN_BYTES, BodyScreen, count_values, screen, screened_in_child
from server.chat_protocol import ChatCompletionRequest
from server.errors import APIError
from server.protocol import CompletionRequest, DetokenizeRequest

LIMITS = Limits()


@pytest.mark.parametrize("size", [10, SCREEN_BYTES + 10])
def test_small_and_large_bodies_parse_to_the_same_model(size):
    body = {"model": "m", "prompt": "x" * size, "stop": ["a", "b"], "logit_bias": {"3": 1.5}}
    raw = json.dumps(body).encode()
    assert parsed(CompletionRequest, raw, LIMITS) == CompletionRequest.model_validate(body)
    padded = json.dumps({**body, "prompt": "p", "pad": [[1, {"a": None}]] * 1000}).encode()
    assert parsed(CompletionRequest, padded, LIMITS).prompt == "p"


def test_errors_are_fastapis():
    with pytest.raises(RequestValidationError) as invalid:
        parsed(CompletionRequest, b'{"model": "m", "prompt": "x", "n": 0}', LIMITS)
    assert invalid.value.errors()[0]["loc"] == ("body", "n")
    with pytest.raises(RequestValidationError) as broken:
        parsed(CompletionRequest, b'{"model": "m",', LIMITS)
    assert broken.value.errors()[0]["type"] == "json_invalid"


@pytest.mark.parametrize("size", [10_000, SCREEN_BYTES])
def test_deep_nesting_and_bad_utf8_are_400s(size):
    deep = b'{"model": "m", "prompt": "x", "x": ' + b"[" * size + b"]" * size + b"}"
    with pytest.raises(APIError, match="nested too deeply") as refused:
        parsed(CompletionRequest, deep, LIMITS)
    assert refused.value.status == 400
    with pytest.raises(APIError, match="UTF-8"):
        parsed(CompletionRequest, b'{"model": "\xff\xfe\xfd"' + b" " * size + b"}", LIMITS)


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": ""}] * 1025}, "messages"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text"}] * 1025}]},
            "messages",
        ),
        (CompletionRequest, {"prompt": "x", "stop_token_ids": [1] * 65}, "stop_token_ids"),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}},
            "logit_bias",
        ),
        (CompletionRequest, {"prompt": [[1] * 1024] * 65}, "prompt"),
        (DetokenizeRequest, {"tokens": [1] * 65537}, "tokens"),
    ],
)
def test_lists_are_counted_before_validation(model, body, param):
    with pytest.raises(APIError) as refused:
        parsed(model, json.dumps({"model": "m", **body}).encode(), LIMITS)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_values_are_counted_whatever_their_nesting():
    assert count_values({"a": [1, "x", None, {"b": []}]}, 100) == 7  # keys are not counted
    assert count_values([[]] * 1000, 10) == 11  # stops once past the limit
    limits = Limits(max_json_values=1000)
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"enum": [[]] * 999}}}
    body = {"model": "m", "prompt": "x", "response_format": schema}
    with pytest.raises(APIError, match="more than 1000 JSON values") as refused:
        screen(json.dumps(body).encode(), limits)
    assert refused.value.status == 400
    body["response_format"]["json_schema"]["schema"]["enum"] = [[]] * 990
    assert screen(json.dumps(body).encode(), limits) == body


BAD_BODIES = [
    b'{"model": "m", "prompt": "x"' + b" " * SCREEN_BYTES,  # not JSON: where it broke is kept
    b'{"model": "m", "tokens": [' + b"1," * SCREEN_BYTES + b"1]}",
    b'{"model": "m", "x": ' + b"[[]," * SCREEN_BYTES + b"[]" + b"]" * SCREEN_BYTES + b"}",
    b'{"model": "m", "x": [' + b"[]," * SCREEN_BYTES + b"[]]}",
]


@pytest.mark.parametrize("raw", BAD_BODIES, ids=["json", "ids", "deep", "values"])
def test_the_child_refuses_a_body_as_the_frontend_would(raw):
    """The child's refusal, raised in the frontend, is the error the frontend's own screen
    raises for the same body."""
    with pytest.raises(Exception) as here:
        screen(raw, LIMITS)
    refusal = screened_in_child(raw, LIMITS)
    assert refusal is not None
    there = refusal.error(raw)
    assert type(there) is type(here.value)
    assert str(there) == str(here.value)
    assert getattr(there, "param", None) == getattr(here.value, "param", None)


def test_a_real_child_screens_and_is_replaced_when_it_dies():
    good = json.dumps({"model": "m", "prompt": "x" * SCREEN_BYTES}).encode()

    async def run() -> None:
        body_screen = BodyScreen()
        body_screen.start()
        try:
            await body_screen.check(good, LIMITS)
            with pytest.raises(APIError, match="token ids"):
                await body_screen.check(BAD_BODIES[1], LIMITS)
            with pytest.raises(json.JSONDecodeError):
                await body_screen.check(BAD_BODIES[0], LIMITS)
            (child,) = body_screen._pool._processes  # one child, started by start()
            os.kill(child, signal.SIGKILL)
            await asyncio.sleep(0.5)
            await body_screen.check(good, LIMITS)  # replaced, and the body screened again
            (replacement,) = body_screen._pool._processes
            assert replacement != child
            with pytest.raises(APIError, match="token ids"):
                await body_screen.check(BAD_BODIES[1], LIMITS)
        finally:
            body_screen.close()

    asyncio.run(run())


CHILD_OF_A_FRONTEND = """
import sys, time
from server.body_screen import BodyScreen
if __name__ == "__main__":
    screen = BodyScreen()
    screen.start()
    while not screen._pool._processes:
        time.sleep(0.05)
    print(*screen._pool._processes, flush=True)
    time.sleep(300)
"""


def test_the_child_ends_when_the_frontend_is_killed(tmp_path):
    script = tmp_path / "frontend.py"
    script.write_text(CHILD_OF_A_FRONTEND)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    frontend = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    child = int(frontend.stdout.readline())
    os.kill(frontend.pid, signal.SIGKILL)
    frontend.wait(10)
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child), "the body screen's child outlived its frontend"


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan that ended waits for init to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
