"""The grammar masks written into the logits (`apply_masks`: the compiled kernel's AVX-512 and
portable paths, and the torch path used without it) equal the straightforward reference, a
bit per token unpacked one at a time, on random masks of every density: vocabularies that are
not a multiple of 32 (the last word's spare bits, set here, write nothing past the row), rows
whose grammar allows only EOS, rows left with nothing finite (then the grammar's tokens get 0),
and rows without a grammar, which stay as they were."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from worker import native
from worker.sample.constraints import Masks, allowed, apply_masks

EOS = 2
GUARD = 64  # floats after the logits, which no path may write


@pytest.fixture(scope="module")
def ops(kv_cache_dir):  # noqa: ANN001 - the private cache the build goes to
    module = native.load().require("the tests")  # the test machines build it
    return module


def reference(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        words = bitmask[i].tolist()
        ok = [(words[t // 32] >> (t % 32)) & 1 == 1 for t in range(vocab)]
        masked = [
            v if keep else float("-inf") for v, keep in zip(out[row].tolist(), ok, strict=True)
        ]
        if all(v == float("-inf") for v in masked):
            masked = [0.0 if keep else float("-inf") for keep in ok]
        out[row] = torch.tensor(masked)
    return out


def case(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int], torch.Tensor]:
    """(buffer, logits viewing it, constrained rows, their bitmask): 8 rows, 6 constrained."""
    gen = torch.Generator().manual_seed(seed)
    n, rows = 8, [0, 2, 3, 5, 6, 7]
    words = (vocab + 31) // 32
    buffer = torch.full((n * vocab + GUARD,), 7.0)
    logits = buffer[: n * vocab].view(n, vocab)
    logits.copy_(torch.randn(n, vocab, generator=gen))
    logits[torch.rand(n, vocab, generator=gen) < 0.05] = float("-inf")  # min_tokens, bias
    density = [0.002, 0.5, 0.98, 0.5, 0.0, 0.0]
    bits = torch.rand(len(rows), words * 32, generator=gen) < torch.tensor(density)[:, None]
    bits[:, vocab:] = True  # the spare bits of the last word, set: they must write nothing
    bits[4] = False
    bits[4, EOS] = True  # a grammar that is done: only EOS
    bits[5] = False
    bits[5, [EOS, vocab - 1]] = True
    logits[rows[5], [EOS, vocab - 1]] = float("-inf")  # nothing finite left: 0 at both
    packed = (bits.view(len(rows), words, 32).long() << torch.arange(32)).sum(-1)
    bitmask = packed.to(torch.int64).where(packed < 2**31, packed - 2**32).to(torch.int32)
    return buffer, logits, rows, bitmask


def paths(ops) -> dict[str, Callable[[torch.Tensor, list[int], torch.Tensor], None]]:  # noqa: ANN001
    return {
        "kernel": lambda x, r, m: ops.mask_logits(x, torch.tensor(r), m, False),
        "kernel-portable": lambda x, r, m: ops.mask_logits(x, torch.tensor(r), m, True),
        "torch": lambda x, r, m: apply_masks(x, Masks(r, m)),
        "sampler-entry": lambda x, r, m: apply_masks(x, Masks(r, m), ops),
    }


@pytest.mark.parametrize("path", ["kernel", "kernel-portable", "torch", "sampler-entry"])
@pytest.mark.parametrize("vocab", [49152, 49155, 300, 33, 31])
def test_every_path_equals_the_reference(ops, path: str, vocab: int) -> None:
    for seed in range(3):
        buffer, logits, rows, bitmask = case(vocab, seed)
        want = reference(logits, rows, bitmask)
        paths(ops)[path](logits, rows, bitmask)
        assert torch.equal(logits, want), (path, vocab, seed)
        assert bool((buffer[-GUARD:] == 7.0).all()), "a write past the logits"
        assert logits[rows[4]].argmax() == EOS
        left = logits[rows[5]]  # nothing finite was allowed: 0 at the grammar's tokens
        assert left.isfinite().nonzero().flatten().tolist() == [EOS, vocab - 1]
        assert left[EOS] == left[vocab - 1] == 0.0


def test_the_unpacked_mask_is_the_bitmask_bit_by_bit() -> None:
    gen = torch.Generator().manual_seed(5)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 10), dtype=torch.int32, generator=gen)
    words = bitmask.tolist()
    want = [[(w[t // 32] >> (t % 32)) & 1 == 1 for t in range(313)] for w in words]
    assert allowed(bitmask, 313).tolist() == want


def test_the_kernel_refuses_what_it_cannot_mask(ops) -> None:  # noqa: ANN001
    logits, mask = torch.zeros(2, 64), torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not in the logits"):
        ops.mask_logits(logits, torch.tensor([2]), mask, False)
    with pytest.raises(RuntimeError, match="bitmask"):
        ops.mask_logits(logits, torch.tensor([0]), mask[:, :1], False)
    with pytest.raises(RuntimeError, match="float32"):
        ops.mask_logits(logits.double(), torch.tensor([0]), mask, False)
