"""The text of a forced call, as calls: `tool_choice` naming a function (the text is its
arguments object) or `required` (the text is `[{"name": ..., "arguments": {...}}, ...]`).
Constrained decoding (server/tools.py) makes the text so; these read it as it grows.

Each call's `arguments` is the text the model wrote for it, character for character, so that
a stream's argument fragments add up to the whole reply's and parse as the model's JSON does.
Text that holds no call (cut short before a name) is given out as content at the end."""

from __future__ import annotations

import json

from server.tool_parser import CallPart, Part, call_id

WHITESPACE = " \t\n\r"


class NamedCall:
    """The whole text is the arguments of the one named function."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False

    def feed(self, text: str) -> list[Part]:
        if not self.started:
            self.started = True
            return [CallPart(0, text, call_id(), self.name)]
        return [CallPart(0, text)] if text else []

    def finish(self) -> list[Part]:
        return self.feed("")


class RequiredCalls:
    """Reads a JSON array of call objects one character at a time. Depth 1 is the array, 2 a
    call object (its keys and values are tracked), 3 and more inside a value."""

    def __init__(self) -> None:
        self.text = ""
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.expect = "key"  # in a call object: key, in_key, colon, value, in_value, after
        self.kind = ""  # the member value being read: string, container or scalar
        self.key_text = ""
        self.key = ""
        self.calls = 0
        self._new_call()

    def _new_call(self) -> None:
        self.name_text = ""
        self.early_arguments = ""  # arguments before the name (kept until it comes)
        self.started = False

    def feed(self, text: str) -> list[Part]:
        self.text += text
        out: list[Part] = []
        for c in text:
            self._char(c, out)
        return out

    def finish(self) -> list[Part]:
        if self.calls == 0 and not self.started and self.text:
            return [self.text]
        return []

    def _char(self, c: str, out: list[Part]) -> None:
        if self.in_string:
            self._take(c, out)
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
                self._string_closed(out)
        elif self.depth >= 3:
            self._in_container(c, out)
        elif self.depth == 2:
            self._in_call(c, out)
        elif c == "[" and self.depth == 0:
            self.depth = 1
        elif c == "{" and self.depth == 1:
            self.depth, self.expect = 2, "key"
            self._new_call()
        elif c == "]" and self.depth == 1:
            self.depth = 0

    def _in_container(self, c: str, out: list[Part]) -> None:
        self._take(c, out)
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 2:
                self._value_done(out)

    def _in_call(self, c: str, out: list[Part]) -> None:
        if self.expect == "in_value":  # a scalar: it ends at a separator
            if c not in WHITESPACE + ",}":
                self._take(c, out)
                return
            self._value_done(out)
        if c in WHITESPACE:
            return
        if self.expect in ("key", "after") and c == "}":
            self.depth = 1
            if self.started:
                self.calls += 1
        elif self.expect == "after" and c == ",":
            self.expect = "key"
        elif self.expect == "key" and c == '"':
            self.expect, self.key_text, self.in_string = "in_key", c, True
        elif self.expect == "colon" and c == ":":
            self.expect = "value"
        elif self.expect == "value":
            self.expect = "in_value"
            self.kind = "string" if c == '"' else "container" if c in "{[" else "scalar"
            self.in_string = c == '"'
            self.depth += c in "{["
            self._take(c, out)

    def _take(self, c: str, out: list[Part]) -> None:
        """A character of the key or member value being read."""
        if self.expect == "in_key":
            self.key_text += c
        elif self.expect != "in_value":
            return
        elif self.key == "name":
            self.name_text += c
        elif self.key == "arguments":
            if self.started:
                out.append(CallPart(self.calls, c))
            else:
                self.early_arguments += c

    def _string_closed(self, out: list[Part]) -> None:
        if self.depth != 2:
            return
        if self.expect == "in_key":
            self.key = _decoded(self.key_text)
            self.expect = "colon"
        elif self.kind == "string":
            self._value_done(out)

    def _value_done(self, out: list[Part]) -> None:
        self.expect, self.kind = "after", ""
        name = _decoded(self.name_text) if self.key == "name" else ""
        if name and not self.started:
            self.started = True
            out.append(CallPart(self.calls, self.early_arguments, call_id(), name))


def _decoded(literal: str) -> str:
    try:
        value = json.loads(literal)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""
