"""Chained, collision-resistant block hashes over a canonical byte encoding.

h_i = sha256(h_{i-1} | tokens of block i | tagged extra keys). Extra keys enter block 0 only;
chaining carries them to every later block. Python's hash() is never used: it is salted per
process and far too weak for content addressing.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from hashlib import sha256
from typing import overload

BlockHash = bytes
ExtraKeys = tuple[tuple[str, str], ...]  # ((kind, value), ...), kind tags keep kinds apart
BlockHasher = Callable[[BlockHash | None, Sequence[int], ExtraKeys], BlockHash]

EXTRA_KEY_KINDS = frozenset({"salt", "lora", "embeds"})
_ROOT_PARENT = b"\x00" * 32  # no sha256 digest is all zeros in practice


def _encode_extra_keys(extra_keys: ExtraKeys) -> bytes:
    parts = [struct.pack("<I", len(extra_keys))]
    for kind, value in sorted(extra_keys):
        if kind not in EXTRA_KEY_KINDS:
            raise ValueError(f"unknown extra key kind {kind!r}")
        kind_bytes, value_bytes = kind.encode(), value.encode()
        parts.append(struct.pack("<I", len(kind_bytes)) + kind_bytes)
        parts.append(struct.pack("<I", len(value_bytes)) + value_bytes)
    return b"".join(parts)


def sha256_block_hash(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: ExtraKeys = ()
) -> BlockHash:
    n = len(token_ids)
    digest = sha256(parent if parent is not None else _ROOT_PARENT)
    digest.update(struct.pack(f"<I{n}q", n, *token_ids))
    digest.update(_encode_extra_keys(extra_keys) if extra_keys else b"\x00\x00\x00\x00")
    return digest.digest()


def request_extra_keys(cache_salt: str | None) -> ExtraKeys:
    return (("salt", cache_salt),) if cache_salt is not None else ()


def extend_chain(
    chain: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int,
    extra_keys: ExtraKeys,
    hasher: BlockHasher = sha256_block_hash,
) -> list[BlockHash]:
    """Append hashes until the chain covers num_blocks full blocks; never rehashes a block."""
    for i in range(len(chain), num_blocks):
        parent = chain[-1] if chain else None
        block_tokens = token_ids[i * block_size : (i + 1) * block_size]
        chain.append(hasher(parent, block_tokens, extra_keys if i == 0 else ()))
    return chain


class LazyChain(Sequence[BlockHash]):
    """A chain of num_blocks hashes computed only as far as it is read.

    A prefix walk stops at its first miss, so a probe through this costs one hash per hit
    block plus one, instead of hashing the whole prompt up front.
    """

    def __init__(
        self,
        token_ids: Sequence[int],
        block_size: int,
        num_blocks: int,
        extra_keys: ExtraKeys,
        hasher: BlockHasher = sha256_block_hash,
    ) -> None:
        self._token_ids = token_ids
        self._block_size = block_size
        self._num_blocks = num_blocks
        self._extra_keys = extra_keys
        self._hasher = hasher
        self.hashes: list[BlockHash] = []

    def __len__(self) -> int:
        return self._num_blocks

    @overload
    def __getitem__(self, index: int) -> BlockHash: ...
    @overload
    def __getitem__(self, index: slice) -> list[BlockHash]: ...
    def __getitem__(self, index: int | slice) -> BlockHash | list[BlockHash]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._num_blocks))]
        if index < 0:
            index += self._num_blocks
        if not 0 <= index < self._num_blocks:
            raise IndexError(index)
        hashes, size = self.hashes, self._block_size
        while len(hashes) <= index:
            i = len(hashes)
            parent, extra = (hashes[-1], ()) if hashes else (None, self._extra_keys)
            hashes.append(self._hasher(parent, self._token_ids[i * size : (i + 1) * size], extra))
        return hashes[index]
