"""How a chat completion looks: its response, or its stream of chunks. With tools, each
choice's text goes through its ToolOutput (server/tool_output.py) into content and calls."""

from __future__ import annotations

from server.chat_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    Delta,
    TokenLogprob,
    TopLogprob,
)
from server.choice import Choice, Generation, TokenEntry, stream_text
from server.streaming import event
from server.tokens import token_text
from server.tool_output import ToolOutput, stream_parts, tool_output, whole
from server.tools import ToolPlan


class ChatView:
    def __init__(
        self, body: ChatCompletionRequest, generation: Generation, tools: ToolPlan | None = None
    ) -> None:
        self.body = body
        self.generation = generation
        self.model = generation.model
        self.tools = tools
        self.outputs: dict[int, ToolOutput | None] = {}

    def _output(self, choice: Choice) -> ToolOutput | None:
        """The choice's tool decoder (None without tools), made on first use."""
        if choice.index not in self.outputs:
            self.outputs[choice.index] = tool_output(self.tools)
        return self.outputs[choice.index]

    def response(self) -> ChatCompletionResponse:
        choices = [self._choice(c) for c in self.generation.choices]
        g = self.generation
        return ChatCompletionResponse(
            id=g.id, created=g.created, model=self.model.name, choices=choices, usage=g.usage()
        )

    def _choice(self, choice: Choice) -> ChatChoice:
        output = self._output(choice)
        reason = choice.finish_reason
        if output is None:
            message = AssistantMessage(content=choice.text)
        else:
            parts = whole(output.feed(choice.text, finished=True))
            message = AssistantMessage(content=parts.content, tool_calls=parts.tool_calls)
            reason = output.finish_reason(reason) if reason else reason
        return ChatChoice(
            index=choice.index,
            message=message,
            logprobs=self._logprobs(choice.entries),
            finish_reason=reason,
        )

    def chunks(self, choice: Choice) -> list[str]:
        """The role first, then content (and tool call) deltas, then the finish reason, each
        its own chunk."""
        out = []
        if not choice.started:
            choice.started = True
            out.append(self._chunk(choice, Delta(role="assistant", content="")))
        if choice.closed:
            return out
        text = stream_text(choice, self.generation.holdback)
        entries = choice.take_entries() if choice.entries is not None else None
        logprobs = self._logprobs(entries)
        output = self._output(choice)
        reason = choice.finish_reason
        if output is None:
            if text or entries:
                out.append(self._chunk(choice, Delta(content=text), logprobs))
        else:
            out += self._tool_chunks(choice, output, text, logprobs)
            reason = output.finish_reason(reason) if reason else reason
        if reason is not None:
            choice.closed = True
            out.append(self._chunk(choice, Delta(), finish=reason))
        return out

    def _tool_chunks(
        self, choice: Choice, output: ToolOutput, text: str, logprobs: ChoiceLogprobs | None
    ) -> list[str]:
        """Content and calls as they come out of the decoder; logprobs go with the first
        chunk (an empty delta when the decoder holds the text back)."""
        parts = stream_parts(output.feed(text, finished=choice.finish_reason is not None))
        deltas = []
        if parts.content:
            deltas.append(Delta(content=parts.content))
        if parts.calls:
            deltas.append(Delta(tool_calls=parts.calls))
        if not deltas and logprobs is not None and logprobs.content:
            deltas.append(Delta())
        return [
            self._chunk(choice, delta, logprobs if i == 0 else None)
            for i, delta in enumerate(deltas)
        ]

    def tail(self) -> list[str]:
        if not self.body.include_usage:
            return []
        g = self.generation
        chunk = ChatCompletionChunk(
            id=g.id, created=g.created, model=self.model.name, choices=[], usage=g.usage()
        )
        return [event(chunk)]

    def _chunk(
        self,
        choice: Choice,
        delta: Delta,
        logprobs: ChoiceLogprobs | None = None,
        finish: str | None = None,
    ) -> str:
        g = self.generation
        part = ChatChunkChoice(
            index=choice.index, delta=delta, logprobs=logprobs, finish_reason=finish
        )
        chunk = ChatCompletionChunk(id=g.id, created=g.created, model=self.model.name,
                                    choices=[part])  # fmt: skip
        return event(chunk, exclude=None if self.body.include_usage else {"usage"})

    def _logprobs(self, entries: list[TokenEntry] | None) -> ChoiceLogprobs | None:
        if entries is None:
            return None
        return ChoiceLogprobs(content=[self._entry(e) for e in entries])

    def _entry(self, entry: TokenEntry) -> TokenLogprob:
        top = [self._top(t, lp) for t, lp in entry.top][: self.body.top_logprobs or 0]
        token = entry.token_id
        return TokenLogprob(
            token=token_text(self.model, token),
            logprob=entry.logprob,
            bytes=list(self.model.token_bytes(token)),
            top_logprobs=top,
        )

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = token_text(self.model, token)
        return TopLogprob(token=text, logprob=logprob, bytes=list(self.model.token_bytes(token)))
