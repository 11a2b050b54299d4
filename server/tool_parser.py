"""Tool calls in the text of `tool_choice: auto`, in the Hermes format (server/tool_prompt.py):
`<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, one call or a JSON list of calls
per tag (SmolLM2 writes lists), any number of tags.

The rules. A tag whose JSON names one of the request's functions with an object of arguments
(`arguments`, or `parameters`; a JSON text of an object is read too) becomes calls, in order;
anything else (malformed JSON, an unknown function, a tag never closed whose text is not a
call) stays in the content as written. With parallel_tool_calls false, only a tag holding one
call counts, and the text after the first call is content. The content is the text outside
calls, without its leading and trailing whitespace (null when nothing is left and there are
calls).

Streaming and whole replies share this parser: content goes out as soon as it cannot be the
start of a tag; a tag is held until it closes (or the text ends), then goes out as calls or as
content. So a stream's parts always add up to the whole reply's."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class CallPart:
    """A part of call `index`: its first carries id and name; every part more arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Part = str | CallPart  # a str is content


class HermesParser:
    def __init__(self, names: frozenset[str], parallel: bool = True) -> None:
        self.names = names
        self.parallel = parallel
        self.pending = ""  # text not yet given out
        self.inside = False  # pending is the body of an open tag
        self.held = ""  # whitespace after the content so far: dropped if nothing follows
        self.began = False  # content began (whitespace before it is dropped)
        self.calls = 0
        self.closed_to_calls = False  # parallel_tool_calls false, and a call was made

    def feed(self, text: str) -> list[Part]:
        self.pending += text
        out: list[Part] = []
        while True:
            if self.inside:
                end = self.pending.find(CLOSE)
                if end < 0:
                    return out
                body, self.pending = self.pending[:end], self.pending[end + len(CLOSE) :]
                self.inside = False
                self._tag(body, out, closed=True)
                continue
            start = -1 if self.closed_to_calls else self.pending.find(OPEN)
            if start < 0:
                keep = 0 if self.closed_to_calls else _partial_tag(self.pending)
                cut = len(self.pending) - keep
                self._content(self.pending[:cut], out)
                self.pending = self.pending[cut:]
                return out
            self._content(self.pending[:start], out)
            self.pending = self.pending[start + len(OPEN) :]
            self.inside = True

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self.inside:
            self.inside = False
            self._tag(self.pending, out, closed=False)
        else:
            self._content(self.pending, out)
        self.pending = self.held = ""
        return out

    def _content(self, text: str, out: list[Part]) -> None:
        if not self.began:
            text = text.lstrip()
            self.began = bool(text)
        if not text:
            return
        text = self.held + text
        kept = text.rstrip()
        self.held = text[len(kept) :]
        if kept:
            out.append(kept)

    def _tag(self, body: str, out: list[Part], closed: bool) -> None:
        calls = parse_calls(body, self.names)
        if calls is None or (not self.parallel and len(calls) != 1):
            self._content(OPEN + body + (CLOSE if closed else ""), out)
            return
        for name, arguments in calls:
            out.append(CallPart(self.calls, arguments, call_id(), name))
            self.calls += 1
        self.closed_to_calls = not self.parallel


def parse_calls(body: str, names: frozenset[str]) -> list[tuple[str, str]] | None:
    """The calls of one tag's body as (name, arguments JSON text), or None if it is not one."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _call(item: Any, names: frozenset[str]) -> tuple[str, str] | None:
    if not isinstance(item, dict):
        return None
    name = item.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def _partial_tag(text: str) -> int:
    """How many characters at the end of `text` could begin an opening tag."""
    for keep in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-keep:]):
            return keep
    return 0
