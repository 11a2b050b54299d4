"""`kvledger export-tokenizer GGUF DIR`: a GGUF file's tokenizer as a Hugging Face tokenizer
directory, for tools that insist on loading one by path (transformers' `AutoTokenizer`,
lm-eval's `tokenizer=`) rather than asking the server (`GET /tokenizer_info`, `/tokenize`).

The directory holds what the frontend itself tokenizes with (kvledger/gguf_tokenizer.py):
`tokenizer.json` (vocabulary, merges, pre-tokenizer, the BOS/EOS the file asks to add),
`tokenizer_config.json` (special tokens, chat template, context length, and the class
transformers loads a bare tokenizer.json with) and `special_tokens_map.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvledger.gguf_file import GGUFError, metadata, open_reader
from kvledger.gguf_tokenizer import GGUFTokenizer, load_gguf_tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# the class transformers builds from a tokenizer.json alone, whatever the model
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def tokenizer_config(found: GGUFTokenizer, context_length: int | None = None) -> dict[str, Any]:
    """tokenizer_config.json's fields for a GGUF file's tokenizer: its special tokens as text,
    its chat template and context length when the file has them."""
    config: dict[str, Any] = {"tokenizer_class": TOKENIZER_CLASS, **found.special_tokens}
    if context_length:
        config["model_max_length"] = context_length
    if found.chat_template:
        config["chat_template"] = found.chat_template
    return config


def context_length(path: Path) -> int | None:
    """The file's `<architecture>.context_length`, read without its vocabulary."""
    meta = metadata(open_reader(path), vocabulary=False)
    value = meta.get(f"{meta.get('general.architecture')}.context_length")
    return int(value) if isinstance(value, int) else None


def export(gguf: Path, directory: Path) -> list[Path]:
    """Writes the directory's files (it is made if missing; files of these names are
    replaced) and returns their paths. GGUFError for a file whose tokenizer cannot be built:
    the same refusal the frontend gives."""
    found = load_gguf_tokenizer(gguf)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in FILES]
    found.tokenizer.save(str(paths[0]))
    config = tokenizer_config(found, context_length(gguf))
    paths[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    paths[2].write_text(json.dumps(found.special_tokens, indent=2, ensure_ascii=False) + "\n")
    return paths


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvledger export-tokenizer",
        description="Write a GGUF file's tokenizer as a Hugging Face tokenizer directory.",
    )
    parser.add_argument("gguf", type=Path, help="the .gguf file")
    parser.add_argument("directory", type=Path, help="where to write the tokenizer's files")
    args = parser.parse_args(argv)
    try:
        paths = export(args.gguf, args.directory)
    except (GGUFError, OSError) as err:
        print(f"kvledger export-tokenizer: {err}", file=sys.stderr, flush=True)
        return 2
    for path in paths:
        print(path)
    return 0
