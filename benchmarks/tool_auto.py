"""`tool_choice: "auto"` as agents use it, measured on a served model beside llama.cpp.

Forty chats offer the same four tools: in twenty one of them obviously applies (the right tool
is known), in twenty none does. For each engine: how often `auto` called the right tool (with
arguments that parse as an object), called a wrong one, or called one where none applies; and,
after a round trip (the model's call, then a tool result), how often the next reply echoes the
result's markup (`<tool_response>`, `tool_response`) instead of answering. Greedy, so a rerun
gives the same counts.

    python -m benchmarks.tool_auto                        # kvledger serving SmolLM2
    python -m benchmarks.tool_auto --llama-server BIN     # and llama.cpp --jinja, same file

docs/benchmarks.md, "Tool calls with tool_choice auto", has the table and the command.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.peers.llama_cpp import llama_server
from benchmarks.peers.report import cpu_line
from kvledger.models import SMOLLM2, smollm2_path


def _tool(name: str, description: str, **params: str) -> dict:
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    schema = {"type": "object", "properties": properties, "required": list(params)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


TOOLS = [
    _tool("get_weather", "Current weather for a city", city="the city's name"),
    _tool("get_stock_price", "Latest share price of a listed company", ticker="stock ticker"),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        amount="the amount",
        source="currency code to convert from",
        target="currency code to convert to",
    ),
    _tool("send_email", "Send an email", to="recipient's address", body="the message text"),
]

APPLIES = [
    ("What is the weather like in Paris right now?", "get_weather"),
    ("Is it raining in London today?", "get_weather"),
    ("Tell me the current temperature in Tokyo.", "get_weather"),
    ("How hot is it in Cairo at the moment?", "get_weather"),
    ("Check the weather in Berlin for me.", "get_weather"),
    ("What is Apple's stock price? The ticker is AAPL.", "get_stock_price"),
    ("Get me the latest share price of MSFT.", "get_stock_price"),
    ("How much is one share of Tesla (TSLA) trading at?", "get_stock_price"),
    ("Look up the stock price for ticker NVDA.", "get_stock_price"),
    ("What's the current price of Amazon stock, AMZN?", "get_stock_price"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 50 GBP?", "convert_currency"),
    ("Change 250 EUR into Swiss francs.", "convert_currency"),
    ("What is 1000 INR in USD?", "convert_currency"),
    ("Convert 20 Canadian dollars to Mexican pesos.", "convert_currency"),
    ("Send an email to bob@example.com saying the meeting moved to 3pm.", "send_email"),
    ("Email alice@example.com: thanks for the report.", "send_email"),
    ("Please send carol@example.com an email that I will be late.", "send_email"),
    ("Write to dave@example.com by email: the invoice is attached.", "send_email"),
    ("Send eve@example.com an email reminding her of lunch on Friday.", "send_email"),
]

NONE_APPLIES = [
    "What is the capital of Australia?",
    "Write a haiku about autumn leaves.",
    "How many legs does a spider have?",
    "Explain what photosynthesis is in one sentence.",
    "What is 12 times 7?",
    "Who wrote Romeo and Juliet?",
    "Give me three tips for better sleep.",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
    "Tell me a short joke about cats.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet goldfish.",
    "Summarise the plot of Cinderella in two sentences.",
    "What is the opposite of 'generous'?",
    "How do I make a cup of tea?",
    "List the primary colours.",
    "What year did the first person walk on the moon?",
    "Why is the sky blue?",
    "What is a prime number?",
    "Recommend a classic novel to read.",
]

ECHO_MARKS = ("<tool_response>", "tool_response", "<tool_call>")


@dataclass
class Counts:
    right: int = 0  # applies: the right tool, arguments an object
    wrong_tool: int = 0  # applies: a call, but not (only) the right tool
    missed: int = 0  # applies: no call
    called_needlessly: int = 0  # none applies: a call anyway
    echoed: int = 0  # after a round trip (one per applying chat): the reply echoes markup
    examples: list[str] = field(default_factory=list)


def chat(url: str, model: str, messages: list[dict], key: str | None) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": 96,
    }
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), headers
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())["choices"][0]["message"]


def _call(tool: str) -> dict:
    """The right tool called with an argument string per parameter, as a client replays it."""
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == tool)
    arguments = {name: "x" for name in schema["properties"]}
    return {
        "id": "call_0",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(arguments)},
    }


def _object_arguments(call: dict) -> bool:
    try:
        return isinstance(json.loads(call["function"]["arguments"]), dict)
    except (ValueError, TypeError, KeyError):
        return False


def measure(url: str, model: str, key: str | None = None) -> Counts:
    counts = Counts()
    for prompt, tool in APPLIES:
        messages = [{"role": "user", "content": prompt}]
        reply = chat(url, model, messages, key)
        calls = reply.get("tool_calls") or []
        names = [c["function"]["name"] for c in calls]
        if not calls:
            counts.missed += 1
            counts.examples.append(f"missed: {prompt!r} -> {(reply.get('content') or '')[:80]!r}")
        elif names == [tool] and _object_arguments(calls[0]):
            counts.right += 1
        else:
            counts.wrong_tool += 1
        # the round trip: the model's own call where it made one, else the right call
        call = calls[0] if calls else _call(tool)
        turn = {"role": "assistant", "content": None, "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": call["id"], "content": '{"ok": true}'}
        after = chat(url, model, [*messages, turn, result], key)
        if any(mark in (after.get("content") or "") for mark in ECHO_MARKS):
            counts.echoed += 1
            counts.examples.append(f"echoed: {(after.get('content') or '')[:80]!r}")
    for prompt in NONE_APPLIES:
        reply = chat(url, model, [{"role": "user", "content": prompt}], key)
        if reply.get("tool_calls"):
            counts.called_needlessly += 1
            counts.examples.append(f"needless: {prompt!r}")
    return counts


def serve_kvledger(args: argparse.Namespace) -> dict:
    from tests.serving import start_serve

    with tempfile.TemporaryDirectory() as tmp:
        served = start_serve(Path(tmp), "--model", SMOLLM2, debug_invariants=False)
        try:
            return vars(measure(served.url, SMOLLM2))
        finally:
            served.stop()


def serve_llama_cpp(args: argparse.Namespace) -> dict:
    with llama_server(args.llama_server, smollm2_path(), 2, 1, 4096, ("--jinja",)) as (url, _):
        return vars(measure(url, "m"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, run --jinja")
    parser.add_argument("--url", help="measure a server already running at this URL instead")
    parser.add_argument("--model", default=SMOLLM2, help="the model name sent with --url")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    if args.url:
        report = {"server": vars(measure(args.url, args.model, args.api_key))}
    else:
        report = {"kvledger": serve_kvledger(args)}
        if args.llama_server:
            report["llama.cpp --jinja"] = serve_llama_cpp(args)
    print(cpu_line())
    print(f"| engine | right tool (of {len(APPLIES)}) | wrong tool | no call | needless call "
          f"(of {len(NONE_APPLIES)}) | echoed after a result |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for engine, c in report.items():
        print(f"| {engine} | {c['right']} | {c['wrong_tool']} | {c['missed']} | "
              f"{c['called_needlessly']} | {c['echoed']} |")  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
