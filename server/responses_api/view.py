"""How a response looks: the whole object, or its stream of events, built from the chat path's
generation. With tools, the text goes through the chat path's decoder (server/tool_output.py)
into message and function_call items; a whole response and a stream are built from the same
parts, in the same order, so the two always agree.

The status: `incomplete` (with `incomplete_details.reason` `max_output_tokens`) when the tokens
ran out, its last item `incomplete` too; else `completed`. The stream's last event, the whole
response, is sent by `tail`, once the generation is over and the response is stored (the route
stores it between the two): a client that reads it may at once continue from it."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from server.choice import Choice, Generation, stream_text
from server.errors import APIError, error_type
from server.responses_api.protocol import ResponsesRequest
from server.responses_api.replies import ResponseObject, Status
from server.tool_output import ToolOutput, tool_output
from server.tool_parser import Part
from server.tools import ToolPlan


@dataclass
class OutputItem:
    """An output item being built: a message's text, or a call's arguments."""

    kind: str  # "message" or "function_call"
    id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    status: Status = "in_progress"

    def shape(self) -> dict[str, Any]:
        if self.kind == "message":
            content = [self.part()] if self.status != "in_progress" else []
            return {"type": "message", "id": self.id, "status": self.status,
                    "role": "assistant", "content": content}  # fmt: skip
        return {"type": "function_call", "id": self.id, "call_id": self.call_id,
                "name": self.name, "arguments": self.text, "status": self.status}  # fmt: skip

    def part(self, text: str | None = None) -> dict[str, Any]:
        text = self.text if text is None else text
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class OutputItems:
    """The response's items from the decoder's parts; each change also as stream events. One
    item is open at a time: a part of another kind closes it (`completed`) and opens the
    next."""

    items: list[OutputItem] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # a call's index -> its item's
    open: int | None = None

    def add(self, parts: list[Part]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, str):
                if part:
                    if self.open is None or self.items[self.open].kind != "message":
                        self._start(OutputItem("message", "msg_" + uuid.uuid4().hex), events)
                    self._more(self.open, part, events)
            elif part.id is not None:
                item = OutputItem("function_call", "fc_" + uuid.uuid4().hex, call_id=part.id)
                item.name = part.name or ""
                self._start(item, events)
                self.calls[part.index] = self.open  # type: ignore[assignment]
                self._more(self.open, part.arguments, events)
            elif part.index in self.calls:
                self._more(self.calls[part.index], part.arguments, events)
        return events

    def close(self, status: Status = "completed") -> list[dict[str, Any]]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        item = self.items[index]
        item.status = status
        where = {"item_id": item.id, "output_index": index}
        if item.kind == "message":
            done = [
                {"type": "response.output_text.done", **where, "content_index": 0,
                 "text": item.text, "logprobs": []},
                {"type": "response.content_part.done", **where, "content_index": 0,
                 "part": item.part()},
            ]  # fmt: skip
        else:
            done = [{"type": "response.function_call_arguments.done", **where,
                     "name": item.name, "arguments": item.text}]  # fmt: skip
        item_done = {"type": "response.output_item.done", "output_index": index}
        return [*done, {**item_done, "item": item.shape()}]

    def output(self) -> list[dict[str, Any]]:
        return [item.shape() for item in self.items]

    def _start(self, item: OutputItem, events: list[dict[str, Any]]) -> None:
        events += self.close()
        self.items.append(item)
        self.open = index = len(self.items) - 1
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": item.shape()})  # fmt: skip
        if item.kind == "message":
            events.append({"type": "response.content_part.added", "item_id": item.id,
                           "output_index": index, "content_index": 0,
                           "part": item.part("")})  # fmt: skip

    def _more(self, index: int | None, text: str, events: list[dict[str, Any]]) -> None:
        if index is None or not text:
            return
        item = self.items[index]
        item.text += text
        where = {"item_id": item.id, "output_index": index}
        if item.kind == "message":
            events.append({"type": "response.output_text.delta", **where, "content_index": 0,
                           "delta": text, "logprobs": []})  # fmt: skip
        else:
            events.append({"type": "response.function_call_arguments.delta", **where,
                           "delta": text})  # fmt: skip


class ResponseView:
    """The one choice of a Responses request's generation, as a response or its events."""

    def __init__(
        self,
        body: ResponsesRequest,
        generation: Generation,
        tools: ToolPlan | None,
        store: bool,
    ) -> None:
        self.body = body
        self.generation = generation
        self.output: ToolOutput | None = tool_output(tools)
        self.items = OutputItems()
        self.store = store
        self.sequence = 0
        self.completed_at: int | None = None
        self.started = self.ended = False

    @property
    def id(self) -> str:
        """`resp_` and the HTTP request's id (the generation's id, past its prefix)."""
        return "resp_" + self.generation.id.partition("-")[2]

    @property
    def finished(self) -> bool:
        return self.generation.choices[0].finish_reason is not None

    def response(self) -> ResponseObject:
        """The whole response, once its generation is over (the route drains it first)."""
        (choice,) = self.generation.choices
        self.items.add(self._parts(choice.text, finished=True))
        self.items.close(self._status(choice))
        return self.snapshot()

    def snapshot(self) -> ResponseObject:
        """The response as it stands: `in_progress` until the generation is over."""
        choice = self.generation.choices[0]
        status = self._status(choice) if choice.finish_reason is not None else "in_progress"
        body = self.body
        fields: dict[str, Any] = {
            "id": self.id,
            "created_at": self.generation.created,
            "status": status,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.generation.model.name,
            "output": self.items.output() if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": _dump(body.tool_choice) if body.tool_choice is not None else "auto",
            "tools": [_dump(t) for t in body.tools or []],
            "store": self.store,
            "user": body.user,
            "metadata": body.metadata or {},
        }
        if body.text is not None and body.text.format is not None:
            fields["text"] = {"format": _dump(body.text.format)}
        if status != "in_progress":
            self.completed_at = self.completed_at or int(time.time())
            fields["completed_at"] = self.completed_at
            fields["usage"] = self._usage()
        if status == "incomplete":
            fields["incomplete_details"] = {"reason": "max_output_tokens"}
        return ResponseObject.model_validate(fields)

    def events(self, choice: Choice) -> list[str]:
        """response.created and response.in_progress first; then the items' events as text
        comes; at the finish, the open item's done events (the last is `tail`'s)."""
        out = []
        if not self.started:
            self.started = True
            start = self.snapshot().model_dump()
            out.append(self._sse({"type": "response.created", "response": start}))
            out.append(self._sse({"type": "response.in_progress", "response": start}))
        if self.ended:
            return out
        text = stream_text(choice, self.generation.holdback)
        finished = choice.finish_reason is not None
        events = self.items.add(self._parts(text, finished))
        if finished:
            self.ended = True
            events += self.items.close(self._status(choice))
        return out + [self._sse(data) for data in events]

    def tail(self) -> list[str]:
        """The last event: the whole response, `response.completed` or `.incomplete`."""
        if not self.started or not self.finished:
            return []
        response = self.snapshot()
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        return [self._sse({"type": kind, "response": response.model_dump()})]

    def error(self, err: APIError) -> str:
        code = err.code or error_type(err.status)
        data = {"type": "error", "code": code, "message": err.message}
        return self._sse({**data, "param": err.param})

    def _sse(self, data: dict[str, Any]) -> str:
        data["sequence_number"] = self.sequence
        self.sequence += 1
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _parts(self, text: str, finished: bool) -> list[Part]:
        if self.output is None:
            return [text] if text else []
        return self.output.feed(text, finished)

    def _status(self, choice: Choice) -> Status:
        return "incomplete" if choice.finish_reason == "length" else "completed"

    def _usage(self) -> dict[str, Any]:
        usage = self.generation.usage()
        return {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.prompt_tokens_details.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }


def _dump(value: Any) -> Any:
    if isinstance(value, str):
        return value
    return value.model_dump(exclude_none=True, by_alias=True)
