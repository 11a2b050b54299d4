"""A GGUF file's tokenizer and chat template, built from its `tokenizer.*` metadata with the
`tokenizers` library's own components.

A `gpt2`-type vocabulary (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM...) becomes a BPE model
over the file's tokens and merges, behind the pre-tokenizer regexes llama.cpp applies for the
file's `tokenizer.ggml.pre` (llama-vocab.cpp: the text is split by each regex in turn, then
mapped to the byte alphabet), with a byte-level decoder. Tokens the file marks CONTROL are
special tokens, USER_DEFINED ones plain added tokens, both matched whole in the text as
llama.cpp matches them. `add_bos_token` / `add_eos_token` decide what encoding adds.

SentencePiece (`llama`), and a pre-tokenizer name not listed here, are refused by name: the
operator can point `--tokenizer` at a directory with the model's tokenizer.json instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from kvledger.gguf_file import GGUFError, metadata, open_reader

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the regexes llama.cpp splits the text with, in order (llama-vocab.cpp).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "gpt-2": (_GPT2,),
    "phi-2": (_GPT2,),
    "jina-es": (_GPT2,),
    "jina-de": (_GPT2,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    # every digit alone, then GPT-2's split
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "codeshell": (r"\p{N}", _GPT2),
    "exaone": (r"\p{N}", _GPT2),
    "minerva": (r"\p{N}", _GPT2),
}
CONTROL, USER_DEFINED = 3, 4
OVERRIDE_HINT = "pass --tokenizer DIR with the model's tokenizer.json instead"


@dataclass(frozen=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    chat_template: str | None
    # bos_token / eos_token / unk_token / pad_token -> their text, for the chat template
    special_tokens: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=4)
def load_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    """The file's tokenizer, chat template and special tokens (parsed once per path)."""
    return build(metadata(open_reader(path)), str(path))


def build(meta: dict[str, Any], path: str) -> GGUFTokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        what = "SentencePiece (llama)" if kind == "llama" else repr(kind)
        raise GGUFError(
            f"{path}: {what} tokenizers in GGUF files are not supported; {OVERRIDE_HINT}"
        )
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZER_REGEXES:
        raise GGUFError(f"{path}: GGUF pre-tokenizer {pre!r} is not supported; {OVERRIDE_HINT}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    tokenizer = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    regexes = PRE_TOKENIZER_REGEXES[pre]
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    _add_tokens(tokenizer, tokens, meta.get("tokenizer.ggml.token_type") or [])
    specials = _special_tokens(meta, tokens)
    post = _post_processor(meta, tokens)
    if post is not None:
        tokenizer.post_processor = post
    return GGUFTokenizer(tokenizer, meta.get("tokenizer.chat_template"), specials)


def _add_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """CONTROL tokens as special, USER_DEFINED as added: both matched whole, never split."""
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=False) if kind == USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _special_tokens(meta: dict[str, Any], tokens: list[str]) -> dict[str, str]:
    out = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            out[f"{name}_token"] = tokens[int(token_id)]
    return out


def _post_processor(meta: dict[str, Any], tokens: list[str]) -> Any:
    """BOS in front / EOS behind, as the file's add_bos_token / add_eos_token ask."""
    parts: list[tuple[str, int]] = []
    for name, key in (("bos", "add_bos_token"), ("eos", "add_eos_token")):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if meta.get(f"tokenizer.ggml.{key}") and token_id is not None:
            parts.append((name, int(token_id)))
    if not parts:
        return None
    ids = dict(parts)
    front = [tokens[ids["bos"]]] if "bos" in ids else []
    back = [tokens[ids["eos"]]] if "eos" in ids else []
    return processors.TemplateProcessing(
        single=[*front, "$A", *back],
        pair=[*front, "$A", *back, *front, "$B", *back],
        special_tokens=[(tokens[i], i) for i in dict.fromkeys(ids.values())],
    )
