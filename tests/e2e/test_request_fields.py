"""Every field of OpenAI's current chat-completions and completions request schemas (the
installed `openai` client's, so that a new field fails here until it is decided), sent to the
frontend in this process (a stand-in worker, tests/e2e/stand_in.py), against its decision:

- SERVED: implemented; the request is answered.
- IGNORED: metadata-like, accepted and without effect (docs/api.md lists them).
- REFUSED: not implemented: the value is a 400 in OpenAI's shape naming the field, and each of
  its no-op values (which ask for nothing the server lacks) is accepted.

The README says parameters kvledger does not implement are refused by name, never silently
ignored: this is that sentence, field by field.
"""

from __future__ import annotations

import asyncio

from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.chat.chat_completion_stream_options_param import (
    ChatCompletionStreamOptionsParam,
)

from server.app import Settings
from tests.e2e.helpers import with_app
from tests.e2e.stand_in import TINY_LLAMA_VOCAB, stand_in_worker
from tests.service.helpers import wait_for

SERVED, IGNORED, REFUSED = "served", "ignored", "refused"
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
STREAMED = {"stream": True}

# field: (decision, the value sent, what else the request needs, no-op values of a REFUSED one);
# first the decisions chat and completions share
COMMON: dict[str, tuple] = {
    "frequency_penalty": (SERVED, 0.5, {}),
    "logit_bias": (SERVED, {"5": 1}, {}),
    "max_tokens": (SERVED, 2, {}),
    "n": (SERVED, 2, {}),
    "presence_penalty": (SERVED, 0.5, {}),
    "seed": (SERVED, 1, {}),
    "stop": (SERVED, ["x"], {}),
    "stream": (SERVED, True, {}),
    "stream_options": (SERVED, {"include_usage": True}, STREAMED),
    "stream_options.include_usage": (SERVED, {"include_usage": False}, STREAMED),
    "temperature": (SERVED, 0.5, {}),
    "top_p": (SERVED, 0.5, {}),
    "user": (IGNORED, "u", {}),
}
CHAT: dict[str, tuple] = {
    **COMMON,
    "messages": (SERVED, USER, {}),
    "model": (SERVED, "m", {}),
    "logprobs": (SERVED, True, {}),
    "max_completion_tokens": (SERVED, 2, {}),
    "parallel_tool_calls": (SERVED, False, {}),
    "response_format": (SERVED, {"type": "text"}, {}),
    "tool_choice": (SERVED, "none", {"tools": [TOOL]}),
    "tools": (SERVED, [TOOL], {"tool_choice": "none"}),
    "top_logprobs": (SERVED, 2, {"logprobs": True}),
    "metadata": (IGNORED, {"k": "v"}, {}),
    "prompt_cache_key": (IGNORED, "k", {}),
    "safety_identifier": (IGNORED, "s", {}),
    "audio": (REFUSED, {"voice": "alloy", "format": "wav"}, {}, [None]),
    "function_call": (REFUSED, "auto", {}, [None, "none"]),
    "functions": (REFUSED, [{"name": "f"}], {}, [None, []]),
    "modalities": (REFUSED, ["text", "audio"], {}, [None, ["text"]]),
    "moderation": (REFUSED, {"model": "omni-moderation-latest"}, {}, [None]),
    "prediction": (REFUSED, {"type": "content", "content": "x"}, {}, [None]),
    "prompt_cache_options": (REFUSED, {"ttl": "30m"}, {}, [None, {}, {"mode": "implicit"}]),
    "prompt_cache_retention": (REFUSED, "24h", {}, [None, "in_memory"]),
    "reasoning_effort": (REFUSED, "high", {}, [None, "none"]),
    "service_tier": (REFUSED, "flex", {}, [None, "auto", "default"]),
    "store": (REFUSED, True, {}, [None, False]),
    "verbosity": (REFUSED, "low", {}, [None]),
    "web_search_options": (REFUSED, {}, {}, [None]),  # {}: a search with the defaults
    "stream_options.include_obfuscation": (
        REFUSED,
        {"include_obfuscation": True},
        STREAMED,
        [{"include_obfuscation": False}],
    ),  # fmt: skip
}
COMPLETIONS: dict[str, tuple] = {
    **COMMON,
    "model": (SERVED, "m", {}),
    "prompt": (SERVED, "hi", {}),
    "echo": (SERVED, True, {}),
    "logprobs": (SERVED, 2, {}),
    "best_of": (REFUSED, 3, {}, [None, 1]),  # only best_of equal to n
    "suffix": (REFUSED, " the end", {}, [None, ""]),
    "stream_options.include_obfuscation": CHAT["stream_options.include_obfuscation"],
}

# the chat fields kvledger refuses are refused on completions too, never ignored there
SHARED_REFUSALS = ("reasoning_effort", "service_tier", "store", "verbosity", "prediction")


def schema_fields(params: type, stream_options: type) -> set[str]:
    keys = params.__required_keys__ | params.__optional_keys__
    nested = stream_options.__required_keys__ | stream_options.__optional_keys__
    return set(keys) | {f"stream_options.{k}" for k in nested}


def test_every_field_of_openais_schemas_has_a_decision():
    chat = schema_fields(
        chat_params.CompletionCreateParamsStreaming, ChatCompletionStreamOptionsParam
    )
    plain = schema_fields(
        completion_create_params.CompletionCreateParamsStreaming, ChatCompletionStreamOptionsParam
    )
    assert sorted(chat ^ set(CHAT)) == [], "a field of OpenAI's chat schema is undecided here"
    assert sorted(plain ^ set(COMPLETIONS)) == [], "a completions field is undecided here"


def cases(path: str, table: dict[str, tuple], base: dict) -> list[tuple]:
    """(path, field, body, the param a 400 must name, or None: answered) for every decision."""
    out = []
    for field, (decision, value, needs, *no_ops) in table.items():
        top = field.split(".")[0]
        sent = {**base, **needs, top: value}
        out.append((path, field, sent, field if decision == REFUSED else None))
        for no_op in no_ops[0] if no_ops else []:
            out.append((path, field, {**base, **needs, top: no_op}, None))
    return out


def all_cases() -> list[tuple]:
    chat_base = {"model": "m", "messages": USER, "max_tokens": 2}
    plain_base = {"model": "m", "prompt": "hi", "max_tokens": 2}
    found = cases("/v1/chat/completions", CHAT, chat_base)
    found += cases("/v1/completions", COMPLETIONS, plain_base)
    for field in SHARED_REFUSALS:
        found.append(("/v1/completions", field, {**plain_base, field: CHAT[field][1]}, field))
    return found


def test_each_field_is_served_ignored_or_refused_by_name(scheduler, model_dir):
    with stand_in_worker(scheduler.target, "m", model_dir, **TINY_LLAMA_VOCAB):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def body(app, http):  # noqa: ANN001, ANN202
            del app
            return [
                (case, await http.post(path, json=sent))
                for case in all_cases()
                for path, _, sent, _ in [case]
            ]

        replies = asyncio.run(with_app(Settings(scheduler=scheduler.target), body))
    wrong = []
    for (path, field, sent, refused), reply in replies:
        if refused is None and reply.status_code != 200:
            wrong.append(f"{path} {field}={sent}: {reply.status_code} {reply.text[:200]}")
        elif refused is not None:
            error = reply.json().get("error", {}) if reply.status_code == 400 else {}
            if error.get("param") != refused or "not supported" not in error.get("message", ""):
                wrong.append(f"{path} {field}={sent}: {reply.status_code} {reply.text[:200]}")
    assert wrong == []
