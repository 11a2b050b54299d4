"""How an Anthropic message looks: the reply, or its stream of events, built from the chat
path's generation. With tools, the text goes through the chat path's decoder
(server/tool_output.py) into text and tool_use blocks; a whole reply and a stream are built
from the same parts, in the same order, so the two always agree.

The stop reason: `max_tokens` when the tokens ran out, `stop_sequence` (and which) when a stop
sequence ended the text, `tool_use` when the model called (by choice or forced), else
`end_turn`. A call's `input` is its arguments' JSON; a call cut short by max_tokens, whose
arguments do not parse, has `{}` (its stream already carried the text as it came)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from server.anthropic.errors import error_body
from server.anthropic.replies import MessageResponse, MessageUsage, StopReason
from server.choice import Choice, Generation, stream_text
from server.errors import APIError
from server.tool_output import ToolOutput, tool_output
from server.tool_parser import Part
from server.tools import ToolPlan

CALL_ID_PREFIX, TOOL_USE_ID_PREFIX = "call_", "toolu_"


def sse(data: dict[str, Any]) -> str:
    """One event, named by its `type` (Anthropic's streams name every event)."""
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


@dataclass
class Block:
    """A content block being built: a text's text, or a call's id, name and arguments."""

    kind: str  # "text" or "tool_use"
    text: str = ""
    id: str = ""
    name: str = ""

    def start(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}

    def delta(self, text: str) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text_delta", "text": text}
        return {"type": "input_json_delta", "partial_json": text}

    def content(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": self.text}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": _input(self.text)}


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Blocks:
    """The reply's blocks from the decoder's parts; each change also as stream events. One
    block is open at a time: a part of another kind closes it and starts the next."""

    blocks: list[Block] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # a call's index -> its block's
    open: int | None = None

    def add(self, parts: list[Part]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, str):
                if part:
                    if self.open is None or self.blocks[self.open].kind != "text":
                        self._start(Block("text"), events)
                    self._more(self.open, part, events)
            elif part.id is not None:
                tool_id = TOOL_USE_ID_PREFIX + part.id.removeprefix(CALL_ID_PREFIX)
                self._start(Block("tool_use", id=tool_id, name=part.name or ""), events)
                self.calls[part.index] = self.open  # type: ignore[assignment]
                self._more(self.open, part.arguments, events)
            elif part.index in self.calls:
                self._more(self.calls[part.index], part.arguments, events)
        return events

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        return [{"type": "content_block_stop", "index": index}]

    def content(self) -> list[dict[str, Any]]:
        return [b.content() for b in self.blocks]

    def _start(self, block: Block, events: list[dict[str, Any]]) -> None:
        events += self.close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        events.append(
            {"type": "content_block_start", "index": self.open, "content_block": block.start()}
        )

    def _more(self, index: int | None, text: str, events: list[dict[str, Any]]) -> None:
        if index is None or not text:
            return
        block = self.blocks[index]
        block.text += text
        events.append({"type": "content_block_delta", "index": index, "delta": block.delta(text)})


class MessageView:
    """The one choice of an Anthropic request's generation, as a message or its events."""

    def __init__(self, generation: Generation, tools: ToolPlan | None) -> None:
        self.generation = generation
        self.output: ToolOutput | None = tool_output(tools)
        self.blocks = Blocks()
        self.started = self.pinged = self.ended = False

    @property
    def id(self) -> str:
        """`msg_` and the HTTP request's id (the generation's id, past its prefix)."""
        return "msg_" + self.generation.id.partition("-")[2]

    def response(self) -> MessageResponse:
        (choice,) = self.generation.choices
        self.blocks.add(self._parts(choice.text, finished=True))
        return self._message(self.blocks.content(), choice)

    def events(self, choice: Choice) -> list[str]:
        """message_start first; then the blocks' events as text comes (a ping after the first
        block starts); at the finish, the open block's stop, message_delta, message_stop."""
        out = []
        if not self.started:
            self.started = True
            start = self._message([], None).model_dump()
            out.append(sse({"type": "message_start", "message": start}))
        if self.ended:
            return out
        text = stream_text(choice, self.generation.holdback)
        finished = choice.finish_reason is not None
        for data in self.blocks.add(self._parts(text, finished)):
            out.append(sse(data))
            self._ping_once(data["type"] == "content_block_start", out)
        if finished:
            out += self._end(choice)
        return out

    def tail(self) -> list[str]:
        """A stream whose events ended without a finish (none should) still ends whole."""
        if self.ended or not self.started:
            return []
        return self._end(self.generation.choices[0])

    def error(self, err: APIError) -> str:
        return sse(error_body(err.status, err.message))

    def _end(self, choice: Choice) -> list[str]:
        self.ended = True
        out = [sse(data) for data in self.blocks.close()]
        self._ping_once(True, out)
        delta = {
            "stop_reason": self._stop_reason(choice),
            "stop_sequence": self._stop_sequence(choice),
        }
        usage = self._usage().model_dump()
        out.append(sse({"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(sse({"type": "message_stop"}))
        return out

    def _ping_once(self, now: bool, out: list[str]) -> None:
        if now and not self.pinged:
            self.pinged = True
            out.append(sse({"type": "ping"}))

    def _parts(self, text: str, finished: bool) -> list[Part]:
        if self.output is None:
            return [text] if text else []
        return self.output.feed(text, finished)

    def _message(self, content: list[dict[str, Any]], choice: Choice | None) -> MessageResponse:
        return MessageResponse.model_validate(
            {
                "id": self.id,
                "model": self.generation.model.name,
                "content": content,
                "stop_reason": self._stop_reason(choice) if choice else None,
                "stop_sequence": self._stop_sequence(choice) if choice else None,
                "usage": self._usage(),
            }
        )

    def _stop_reason(self, choice: Choice) -> StopReason | None:
        if choice.finish_reason is None:
            return None
        if choice.finish_reason == "length":
            return "max_tokens"
        if choice.stop_string is not None:
            return "stop_sequence"
        if self.output is not None and self.output.called:
            return "tool_use"
        return "end_turn"

    def _stop_sequence(self, choice: Choice) -> str | None:
        return choice.stop_string if self._stop_reason(choice) == "stop_sequence" else None

    def _usage(self) -> MessageUsage:
        usage = self.generation.usage()
        cached = usage.prompt_tokens_details.cached_tokens
        return MessageUsage(
            input_tokens=usage.prompt_tokens - cached,
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=cached,
        )
