"""A chat choice's text as content and tool calls, whole or streamed, for a request with
tools. One decoder per choice reads the text as it grows (server/tool_parser.py for `auto`,
server/tool_forced.py for a named function or `required`); a whole reply is its parts joined,
a stream sends them as they come, so the two always agree.

The finish reason follows OpenAI's: `tool_calls` when the model chose to call (`auto`) or had
to (`required`), `stop` for a named function, and `length` whenever the tokens ran out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from server.tool_forced import NamedCall, RequiredCalls
from server.tool_parser import CallPart, HermesParser, Part
from server.tool_protocol import CalledFunction, FunctionDelta, ToolCall, ToolCallDelta
from server.tools import ToolPlan


class Decoder(Protocol):
    def feed(self, text: str) -> list[Part]: ...

    def finish(self) -> list[Part]: ...


@dataclass
class ToolOutput:
    """The decoder of one choice and what it gave out so far."""

    plan: ToolPlan
    decoder: Decoder
    called: bool = False

    def feed(self, text: str, finished: bool) -> list[Part]:
        parts = self.decoder.feed(text) if text else []
        if finished:
            parts += self.decoder.finish()
        self.called |= any(isinstance(p, CallPart) for p in parts)
        return parts

    def finish_reason(self, reason: str) -> str:
        if reason == "stop" and self.called and self.plan.choice != "named":
            return "tool_calls"
        return reason


def tool_output(plan: ToolPlan | None) -> ToolOutput | None:
    """None when nothing is parsed: no tools, or tool_choice none."""
    if plan is None or plan.choice == "none":
        return None
    if plan.choice == "named":
        assert plan.named is not None
        return ToolOutput(plan, NamedCall(plan.named))
    if plan.choice == "required":
        return ToolOutput(plan, RequiredCalls())
    return ToolOutput(plan, HermesParser(plan.names, plan.parallel))


@dataclass
class Message:
    content: str | None
    tool_calls: list[ToolCall] | None


def whole(parts: list[Part]) -> Message:
    """A whole reply: content is null when the model only called."""
    content = "".join(p for p in parts if isinstance(p, str))
    calls: dict[int, ToolCall] = {}
    for part in parts:
        if not isinstance(part, CallPart):
            continue
        if part.index not in calls:
            calls[part.index] = ToolCall(
                id=part.id or "", function=CalledFunction(name=part.name or "", arguments="")
            )
        calls[part.index].function.arguments += part.arguments
    listed = [calls[i] for i in sorted(calls)] or None
    return Message(content if content or not listed else None, listed)


@dataclass
class StreamParts:
    """Parts grouped for chunks: content, then the calls' deltas, each merged by call."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


def stream_parts(parts: list[Part]) -> StreamParts:
    out = StreamParts()
    for part in parts:
        if isinstance(part, str):
            out.content += part
        elif part.id is not None:
            out.calls.append(
                ToolCallDelta(
                    index=part.index,
                    id=part.id,
                    type="function",
                    function=FunctionDelta(name=part.name, arguments=part.arguments),
                )
            )
        elif out.calls and out.calls[-1].index == part.index:
            function = out.calls[-1].function
            assert function is not None
            function.arguments = (function.arguments or "") + part.arguments
        else:
            out.calls.append(
                ToolCallDelta(index=part.index, function=FunctionDelta(arguments=part.arguments))
            )
    return out
