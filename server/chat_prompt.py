"""Chat messages to prompt token ids, through the model's chat template (chat and /tokenize).

In order, each before the work it bounds: the messages and their content parts are counted,
chat_template_kwargs measured, the template rendered under the model's prompt bound (it stops
as soon as the text passes it), then the text tokenized, with special-token text from the
client as plain text unless the server allows it (server/plain_content.py)."""

from __future__ import annotations

from typing import Any

from kvledger.config.frontend import Limits
from server.bounds import check_count, check_names, check_template_kwargs
from server.chat_protocol import ChatMessage, ChatTemplateOptions
from server.chat_template import ChatTemplate, ChatTemplateError, RenderTooLong, ReservedKwarg
from server.client import ServedModel
from server.errors import APIError
from server.plain_content import Escaper, MarkerError, encode_plain_spans
from server.tokens import check_text_fits, too_long
from server.tool_prompt import (
    check_tool_messages,
    hermes_messages,
    results_as_tool_turns,
    tool_dicts,
    with_parsed_arguments,
)
from server.tools import ToolPlan

DEFAULT_LIMITS = Limits()


def chat_prompt(
    messages: list[ChatMessage],
    options: ChatTemplateOptions,
    model: ServedModel,
    limits: Limits = DEFAULT_LIMITS,
    special_tokens_in_content: bool = False,
    tools: ToolPlan | None = None,
) -> list[int]:
    """`tools`: the request's tools (server/tools.py), rendered as the template reads them or
    in the Hermes format (server/tool_prompt.py)."""
    template = _template_of(model)
    if options.add_generation_prompt and options.continue_final_message:
        raise APIError(
            400,
            "continue_final_message continues the last message; it cannot be combined with "
            "add_generation_prompt (set add_generation_prompt to false)",
            param="continue_final_message",
        )
    check_messages(messages, limits)
    check_template_kwargs(options.chat_template_kwargs, limits)
    plain = [_plain(m, i) for i, m in enumerate(messages)]
    kwargs = options.chat_template_kwargs
    escaper = None if special_tokens_in_content else Escaper(model.special_texts)
    if escaper is not None:
        # every field a client set, but its role (which the template matches on)
        plain = [{k: v if k == "role" else escaper.escape(v) for k, v in m.items()} for m in plain]
        kwargs = escaper.escape(kwargs)
    plain, tool_list = _with_tools(template, plain, tools, escaper)
    text = _render(template, plain, options, kwargs, model, tool_list)
    spans: list[tuple[int, int]] = []
    if escaper is not None:
        try:
            text, spans = escaper.restore(text)
        except MarkerError as err:
            raise APIError(400, str(err), param="messages") from None
    check_text_fits(len(text), model, "messages")
    _check_unicode(text)
    special = options.add_special_tokens
    ids = encode_plain_spans(model.tokenizer, model.special_texts, text, spans, special)
    if not ids:
        raise APIError(400, "the messages render to an empty prompt", param="messages")
    return ids


def _check_unicode(text: str) -> None:
    """A message's other fields are the template's to read and are not checked one by one: a
    lone surrogate one of them carried into the text cannot be tokenized (it was a 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400, "messages must be valid Unicode text (no lone surrogates)", param="messages"
        ) from None


def check_messages(messages: list[ChatMessage], limits: Limits) -> None:
    """Counts before any work: messages, content parts across them, and names."""
    check_count(len(messages), limits.max_messages, "messages", "messages")
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    check_count(parts, limits.max_content_parts, "messages", "content parts")
    for message in messages:
        check_names(limits, name=message.name)
    check_tool_messages(messages, limits)


def _with_tools(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: ToolPlan | None,
    escaper: Escaper | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the `tools` variable the template gets (server/tool_prompt.py)."""
    offered = tool_dicts(tools.offered) if tools else []
    escape = escaper.escape if escaper is not None else _same
    if template.reads_tools:
        return with_parsed_arguments(messages), escape(offered) or None
    return hermes_messages(messages, offered, escape, results_as_tool_turns(template)), None


def _same(value: Any) -> Any:
    return value


def _render(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    options: ChatTemplateOptions,
    kwargs: dict[str, Any] | None,
    model: ServedModel,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    try:
        return template.render(
            messages,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            extra=kwargs,
            max_chars=model.max_prompt_chars,
            tools=tools,
        )
    except RenderTooLong:
        raise too_long(model, "messages", "the rendered messages") from None
    except ReservedKwarg as err:
        raise APIError(400, str(err), param="chat_template_kwargs") from None
    except ChatTemplateError as err:
        raise APIError(400, str(err), param="messages") from None


def _template_of(model: ServedModel) -> ChatTemplate:
    """The model's template, or a 400 saying what would give it one: --chat-template, except
    for an embedding model, which never takes one (the flag would not help)."""
    if model.is_embedding:
        raise APIError(
            400,
            f"model `{model.name}` is an embedding model: it has no chat template",
            param="model",
        )
    if model.chat_template is None:
        raise APIError(
            400,
            f"model `{model.name}` has no chat template (neither `chat_template` in its "
            "tokenizer_config.json nor a chat_template.jinja): start the server with "
            "--chat-template (a file or the template text), or use /v1/completions",
            param="messages",
        )
    return model.chat_template


def _plain(message: ChatMessage, index: int) -> dict[str, Any]:
    """The message as a template reads it: fields that are set (transformers drops None), and
    text parts joined into one string, which every template understands."""
    plain = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        texts = []
        for j, part in enumerate(message.content):
            if part.type != "text" or part.text is None:
                what = f"content of type `{part.type}` is not supported"
                if part.type == "text":
                    what = "a text part has no `text`"
                raise APIError(
                    400,
                    f"messages[{index}].content[{j}]: {what}; this server serves text only "
                    '(`{"type": "text", "text": ...}`)',
                    param=f"messages.{index}.content",
                )
            texts.append(part.text)
        plain["content"] = "\n".join(texts)
    return plain
