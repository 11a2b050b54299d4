"""GET /tokenizer_info's body, in vLLM's shape: the model's tokenizer configuration as
transformers reads tokenizer_config.json (special tokens as their text, file paths left out),
`tokenizer_class`, and the chat template this server renders with.

A client without a local tokenizer learns the special tokens and the template here and
tokenizes through /tokenize: lm-eval's `local-completions` probes this route (it needs
`eos_token`) before falling back to downloading a Hugging Face tokenizer by the model's name,
which fails offline. A GGUF file's configuration is the one `kvledger export-tokenizer` writes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from kvledger.export_tokenizer import tokenizer_config
from kvledger.gguf_file import GGUFError, is_gguf
from kvledger.gguf_tokenizer import load_gguf_tokenizer
from server.chat_template import read_json_object
from server.client import ServedModel

# server paths, not configuration: a client has no use for them
PATH_FIELDS = frozenset({"vocab_file", "merges_file", "tokenizer_file", "name_or_path"})
FAST_CLASS = "PreTrainedTokenizerFast"


class TokenizerInfoResponse(BaseModel):
    """vLLM's: tokenizer_config.json's fields, whatever the model has, and the class."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str


def tokenizer_info(model: ServedModel) -> dict[str, Any]:
    """The fields a client tokenizes by. `eos_token` is always there (null only when the
    model has none); `model_max_length` is the context this server serves, not the
    tokenizer's nominal one; `chat_template` is the template chat requests render with
    (--chat-template included), absent when there is none."""
    source = model.info.tokenizer_path or model.info.model_path
    info = {k: _plain(v) for k, v in _config(source).items() if k not in PATH_FIELDS}
    info["eos_token"] = info.get("eos_token") or _eos_text(model)
    info["model_max_length"] = model.info.max_model_len
    info["tokenizer_class"] = _fast(info.get("tokenizer_class"))
    info.pop("chat_template", None)
    if model.chat_template is not None:
        info["chat_template"] = model.chat_template.source
    return info


@functools.lru_cache(maxsize=16)
def _config(source: str) -> dict[str, Any]:
    """The configuration of a model directory or GGUF file (read once per path); {} when it
    has none that can be read: the tokenizer itself loaded, so the route still answers."""
    if is_gguf(source):
        try:
            return tokenizer_config(load_gguf_tokenizer(source))
        except GGUFError:
            return {}
    directory = Path(source)
    config = read_json_object(directory / "tokenizer_config.json")
    for name, value in read_json_object(directory / "special_tokens_map.json").items():
        config.setdefault(name, value)
    return config


def _plain(value: object) -> object:
    """An AddedToken as saved (`{"content": "<s>", "lstrip": false, ...}`) becomes its text,
    as vLLM gives it; other values are copied as they are."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _eos_text(model: ServedModel) -> str | None:
    """The text of the first token the worker stops at, for a configuration that names none."""
    ids = list(model.info.eos_token_ids)
    return model.tokenizer.id_to_token(ids[0]) if ids else None


def _fast(name: object) -> str:
    """The server tokenizes with tokenizer.json: transformers' fast class of the configured
    one (`LlamaTokenizer` -> `LlamaTokenizerFast`), as vLLM reports the class it loaded."""
    if not isinstance(name, str) or not name:
        return FAST_CLASS
    return name if name.endswith("Fast") else f"{name}Fast"
