from collections.abc import Sequence
from hashlib import sha256

import pytest

from scheduler_svc.core.block_hash import (
    ExtraKeys,
    LazyChain,
    extend_chain,
    request_extra_keys,
    sha256_block_hash,
)


def test_hash_is_sha256_of_a_canonical_encoding() -> None:
    parent = sha256(b"p").digest()
    expected = sha256(
        parent
        + (3).to_bytes(4, "little")
        + b"".join(t.to_bytes(8, "little", signed=True) for t in (1, 2, 3))
        + (0).to_bytes(4, "little")
    ).digest()
    assert sha256_block_hash(parent, [1, 2, 3]) == expected
    assert sha256_block_hash(parent, (1, 2, 3)) == expected  # any sequence type


def test_hash_depends_on_parent_tokens_and_order() -> None:
    root = sha256_block_hash(None, [1, 2])
    assert root != sha256_block_hash(None, [2, 1])
    assert sha256_block_hash(root, [3, 4]) != sha256_block_hash(None, [3, 4])
    assert sha256_block_hash(None, [1, 2]) != sha256_block_hash(None, [1, 2, 0])
    assert sha256_block_hash(None, [-1]) != sha256_block_hash(None, [2**32 - 1])


def test_extra_key_kinds_never_collide() -> None:
    salt = sha256_block_hash(None, [1], (("salt", "x"),))
    lora = sha256_block_hash(None, [1], (("lora", "x"),))
    plain = sha256_block_hash(None, [1])
    assert len({salt, lora, plain}) == 3
    # the encoding is length-prefixed: shifting bytes between kind and value cannot collide
    assert sha256_block_hash(None, [1], (("salt", "ab"),)) != sha256_block_hash(
        None, [1], (("salt", "a"), ("salt", "b"))
    )
    # canonical: the order extra keys are given in does not matter
    both = (("salt", "s"), ("lora", "l"))
    assert sha256_block_hash(None, [1], both) == sha256_block_hash(None, [1], both[::-1])


def test_unknown_extra_key_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown extra key kind"):
        sha256_block_hash(None, [1], (("tenant", "x"),))


def test_salt_enters_block_zero_only_and_chaining_carries_it() -> None:
    tokens = list(range(12))
    plain = extend_chain([], tokens, 4, 3, request_extra_keys(None))
    salted = extend_chain([], tokens, 4, 3, request_extra_keys("s"))
    assert salted[0] == sha256_block_hash(None, tokens[:4], (("salt", "s"),))
    assert salted[1] == sha256_block_hash(salted[0], tokens[4:8])  # no salt of its own
    assert all(p != s for p, s in zip(plain, salted, strict=True))


def test_chain_extends_incrementally_and_never_rehashes() -> None:
    calls: list[tuple[int, ...]] = []

    def counting(parent: bytes | None, tokens: Sequence[int], extra: ExtraKeys) -> bytes:
        calls.append(tuple(tokens))
        return sha256_block_hash(parent, tokens, extra)

    tokens = list(range(10))
    chain = extend_chain([], tokens, 4, 1, (), counting)
    extend_chain(chain, tokens, 4, 2, (), counting)
    extend_chain(chain, tokens, 4, 2, (), counting)  # already there: nothing to do
    assert calls == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert chain == extend_chain([], tokens, 4, 2, ())


def test_lazy_chain_equals_the_eager_chain_and_hashes_on_demand() -> None:
    tokens = list(range(23))
    keys = request_extra_keys("tenant")
    eager = extend_chain([], tokens, 4, 5, keys)
    lazy = LazyChain(tokens, 4, 5, keys)
    assert len(lazy) == 5 and lazy.hashes == []
    assert lazy[1] == eager[1] and len(lazy.hashes) == 2
    assert lazy[-1] == eager[4] and lazy[1:3] == eager[1:3] and list(lazy) == eager
    with pytest.raises(IndexError):
        lazy[5]
