"""Finding and opening a GGUF file (llama.cpp's format), torch-free: the worker reads its
weights from it (`worker/gguf/`) and the frontend its tokenizer and chat template
(`kvledger/gguf_tokenizer.py`).

Files are read with the `gguf` package maintained by llama.cpp's authors; any failure to parse
one (a truncated download, another format) is a `GGUFError` naming the file, never a traceback
from inside the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gguf import GGUFReader

SUFFIX = ".gguf"
INSTALL_HINT = "pip install gguf"
VOCABULARY_KEYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
)
# Longest string a field may hold, in bytes, checked before any is decoded: a vocabulary's
# tokens and merges are short (SmolLM2's longest token: 162 bytes), a chat template is a page
# of Jinja; a longer one is a broken or hostile file (a token of a gigabyte took a tokenizer
# build to more than twice its size in memory).
MAX_TOKEN_BYTES = 4096
MAX_TEMPLATE_BYTES = 1 << 20
MAX_STRING_BYTES = 64 << 10
MAX_ARRAY_ITEMS = 1 << 22  # a vocabulary of four million tokens


class GGUFError(ValueError):
    """A GGUF file this process cannot use; the message is one line naming cause and fix."""


def is_gguf(path: str | Path) -> bool:
    """True for a file named *.gguf (the path the worker reports for a GGUF model)."""
    return str(path).endswith(SUFFIX)


def find_gguf(directory: Path) -> Path | None:
    """The one *.gguf in a directory without a config.json; None when it has none.

    A directory holding several is refused: which one to serve is the operator's choice.
    """
    if (directory / "config.json").is_file():
        return None
    files = sorted(directory.glob(f"*{SUFFIX}"))
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise GGUFError(f"{directory} holds several GGUF files ({names}); pass one as --model")
    return files[0] if files else None


def open_reader(path: str | Path) -> GGUFReader:
    """The file parsed by `gguf.GGUFReader` (header read, tensors memory-mapped, not copied)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GGUFError(f"reading {path} needs the gguf package: {INSTALL_HINT}") from None
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    try:
        reader = GGUFReader(path)
    except Exception as err:  # noqa: BLE001 - the package raises many kinds on a bad file
        raise GGUFError(
            f"{path} is not a readable GGUF file (truncated or malformed: {_one_line(err)}); "
            "download it again"
        ) from None
    _check_complete(reader, path)
    _check_strings(reader, path)
    return reader


def metadata(reader: GGUFReader, vocabulary: bool = True) -> dict[str, Any]:
    """Every key/value field as a plain Python value (str, int, float, bool or list).

    `vocabulary=False` leaves out the tokenizer's token, score, type and merge lists (tens of
    thousands of strings each: a second to decode, and the worker needs none of them).
    """
    return {
        key: found.contents()
        for key, found in reader.fields.items()
        if not key.startswith("GGUF.") and (vocabulary or key not in VOCABULARY_KEYS)
    }


def vocabulary_size(reader: GGUFReader) -> int:
    """How many tokens the file's tokenizer lists (0 when it carries none)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return 0 if tokens is None else len(tokens.data)


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value, or `default` when the file lacks it."""
    found = reader.fields.get(key)
    return default if found is None else found.contents()


def _check_complete(reader: GGUFReader, path: Path) -> None:
    """A file cut short ends before its last tensor's bytes: refused here, not mid-load."""
    size = len(reader.data)
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size:
            raise GGUFError(
                f"{path} is truncated: tensor {tensor.name} ends at byte "
                f"{tensor.data_offset + tensor.n_bytes}, the file has {size}; download it again"
            )


def _check_strings(reader: GGUFReader, path: Path) -> None:
    """Every string field, and every string of an array, within its bound (read from the
    lengths the file gives, nothing decoded); every array within MAX_ARRAY_ITEMS."""
    from gguf import GGUFValueType

    for key, found in reader.fields.items():
        if not found.types or GGUFValueType.STRING not in found.types:
            if found.types and found.types[0] == GGUFValueType.ARRAY:
                _check_items(key, len(found.data), path)
            continue
        limit = _string_limit(key)
        if found.types[0] == GGUFValueType.ARRAY:
            _check_items(key, len(found.data), path)
            sizes = (len(found.parts[i]) for i in found.data)
        else:
            sizes = iter([len(found.parts[-1])])
        longest = max(sizes, default=0)
        if longest > limit:
            raise GGUFError(
                f"{path}: metadata {key} holds a string of {longest} bytes (at most {limit}); "
                "the file is not a model this server can serve"
            )


def _check_items(key: str, count: int, path: Path) -> None:
    if count > MAX_ARRAY_ITEMS:
        raise GGUFError(f"{path}: metadata {key} lists {count} items (at most {MAX_ARRAY_ITEMS})")


def _string_limit(key: str) -> int:
    if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        return MAX_TOKEN_BYTES
    if key.startswith("tokenizer.chat_template"):
        return MAX_TEMPLATE_BYTES
    return MAX_STRING_BYTES


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:200]
