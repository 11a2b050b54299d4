"""Chat messages to prompt token ids, through the model's chat template (chat and /tokenize)."""

from __future__ import annotations

from typing import Any

from server.chat_protocol import ChatMessage, ChatTemplateOptions
from server.chat_template import ChatTemplate, ChatTemplateError
from server.client import ServedModel
from server.errors import APIError
from server.tokens import check_text_fits


def chat_prompt(
    messages: list[ChatMessage], options: ChatTemplateOptions, model: ServedModel
) -> list[int]:
    template = _template_of(model)
    if options.add_generation_prompt and options.continue_final_message:
        raise APIError(
            400,
            "continue_final_message continues the last message; it cannot be combined with "
            "add_generation_prompt (set add_generation_prompt to false)",
            param="continue_final_message",
        )
    plain = [_plain(m, i) for i, m in enumerate(messages)]
    try:
        text = template.render(
            plain,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            extra=options.chat_template_kwargs,
        )
    except ChatTemplateError as err:
        raise APIError(400, str(err), param="messages") from None
    check_text_fits(len(text), model, "messages")
    ids = model.tokenizer.encode(text, add_special_tokens=options.add_special_tokens).ids
    if not ids:
        raise APIError(400, "the messages render to an empty prompt", param="messages")
    return ids


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
