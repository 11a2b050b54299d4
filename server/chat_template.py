"""A model's chat template, rendered with jinja2 in a sandbox set up the way transformers'
`apply_chat_template` sets it up, so that a model's own template gives the same text (and so
the same token ids) here as there.

Templates come from the model directory (`chat_template` in tokenizer_config.json, or
chat_template.jinja beside it) or from `--chat-template` (a file path, or the template text).
They are untrusted code: the sandbox is immutable, and the globals are transformers' own."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvledger.gguf_file import is_gguf

log = logging.getLogger(__name__)

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# What a template reads that the server sets: chat_template_kwargs may not replace them (a
# client's `eos_token` of 1 MB, written after each of 1,000 messages, made a 1 GB prompt).
RESERVED_NAMES = frozenset(
    {
        *SPECIAL_TOKEN_NAMES,
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "raise_exception",
        "strftime_now",
        # jinja2's own globals
        "range",
        "dict",
        "lipsum",
        "cycler",
        "joiner",
        "namespace",
    }
)
# Appended to the final message with continue_final_message, and cut off with what follows.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# vLLM's test: a --chat-template value holding none of these is meant as a file path.
TEMPLATE_CHARS = "{}\n"


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: the template refused them, or it is broken."""


class RenderTooLong(ChatTemplateError):
    """The rendered prompt passed its bound while rendering (it was cut short there)."""

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"the rendered prompt is longer than {max_chars} characters")
        self.max_chars = max_chars


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        extra: dict[str, Any] | None = None,
        max_chars: int | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text. `extra` (chat_template_kwargs) adds variables the template reads;
        it may not replace one the server sets (RESERVED_NAMES). Rendering stops, with
        RenderTooLong, as soon as the text passes `max_chars`: a template may repeat a
        variable per message, so the bound is kept while rendering, not checked after."""
        messages = [dict(m) for m in messages]
        final = None
        if continue_final_message:
            final = messages[-1].get("content")
            if not isinstance(final, str):
                raise ChatTemplateError("continue_final_message needs a final message with text")
            messages[-1]["content"] = final + CONTINUE_TAG
        reserved = sorted(RESERVED_NAMES.intersection(extra or {}))
        if reserved:
            raise ReservedKwarg(reserved[0])
        variables = {**self.special_tokens, **(extra or {})}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
        variables.update(tools=tools or None, documents=None)
        try:
            text = _bounded(_compiled(self.source).generate(**variables), max_chars)
        except RenderTooLong:
            raise
        except jinja2.TemplateError as err:
            raise ChatTemplateError(f"the chat template refused the messages: {err}") from None
        except Exception as err:  # noqa: BLE001 - a template is user code: any failure is its own
            raise ChatTemplateError(f"the chat template failed: {type(err).__name__}") from None
        if final is not None:
            text = _cut_at_tag(text)
        return text

    @property
    def reads_tools(self) -> bool:
        """Whether the template renders `tools` itself (else server/tool_prompt.py writes
        them, and the calls and results of the conversation, in the Hermes format)."""
        return "tools" in _variables(self.source)


class ReservedKwarg(ChatTemplateError):
    """chat_template_kwargs named a variable the server sets."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"chat_template_kwargs may not set `{name}`: the server sets it (special tokens, "
            "messages, tools, documents, generation flags and the template's functions)"
        )
        self.name = name


def _bounded(pieces: Iterator[str], max_chars: int | None) -> str:
    """The rendered pieces joined, or RenderTooLong once they pass `max_chars` (the render
    stops there: its generator is closed, nothing more is produced)."""
    out: list[str] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        if max_chars is not None and total > max_chars:
            raise RenderTooLong(max_chars)
        out.append(piece)
    return "".join(out)


def _cut_at_tag(text: str) -> str:
    """Ends the text where the final message ends (what the template adds after it goes),
    keeping the message's own trailing spaces unless the template trimmed them."""
    tag = CONTINUE_TAG.strip()
    if tag not in text:
        raise ChatTemplateError("the chat template dropped the final message to continue")
    at = text.rindex(tag)
    if text[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders
    its body; the mask itself is for training, not serving."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: plain json.dumps (jinja's own escapes HTML characters)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template does not parse: {err}") from None


@lru_cache(maxsize=16)
def _variables(source: str) -> frozenset[str]:
    """The variables a template reads from its context (jinja2's own analysis)."""
    env = ImmutableSandboxedEnvironment(extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template does not parse: {err}") from None


def load_chat_template(model_dir: str | Path, override: str | None = None) -> ChatTemplate | None:
    """The template to use for a model: `override` (--chat-template: a file or the text),
    else the model directory's (a GGUF file's `tokenizer.chat_template`); None when neither
    has one."""
    if is_gguf(model_dir):
        from kvledger.gguf_tokenizer import load_gguf_tokenizer

        found = load_gguf_tokenizer(model_dir)
        source = _template_text(override) if override else found.chat_template
        return ChatTemplate(source, found.special_tokens) if source else None
    directory = Path(model_dir)
    config = read_json_object(directory / "tokenizer_config.json")
    specials = _special_tokens(config, read_json_object(directory / "special_tokens_map.json"))
    source = _template_text(override) if override else _directory_template(directory, config)
    return ChatTemplate(source, specials) if source else None


def check_chat_template(override: str) -> None:
    """--chat-template, checked before the server starts (as vLLM checks it): a file that
    exists, or template text that parses. Found only when rendering, a typo'd path became the
    prompt of every chat request, and a broken template a 400 for every client."""
    _compiled(_template_text(override))


def _template_text(override: str) -> str:
    """vLLM's rule: an existing file is read; anything else is the template itself, unless it
    has neither braces nor a newline: that is a path to a file that is not there, refused."""
    path = Path(override).expanduser()
    try:
        if path.is_file():
            return path.read_text()
    except OSError:  # a long template text is not a valid path
        pass
    if not any(c in override for c in TEMPLATE_CHARS):
        raise ChatTemplateError(
            f"{override!r} is not a file (and, with no braces or newline, not a template)"
        )
    return override


def _directory_template(directory: Path, config: dict[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one serves chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _special_tokens(config: dict[str, Any], token_map: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name, token_map.get(name))
        if isinstance(value, dict):  # an AddedToken as saved: {"content": ..., ...}
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object; {} for a file that cannot be read or holds something else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
