"""The compiled CPU module as a CPU without AVX-512 builds it (`-march=x86-64-v3`: AVX2 and
FMA): the AVX-512 forms are compiled out there (`worker/csrc/decode_block.h`) and the portable
ones must give the same results. It runs wherever the CPU can run AVX2 code, which is where
that build would come from."""

from __future__ import annotations

import platform

import pytest
import torch

from tests.worker.attention_reference import reference, shared_prefix_layout
from worker import native

X86_64_V3 = {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}


@pytest.fixture(scope="module")
def modules():
    if platform.machine() != "x86_64" or not set(native._cpu_flags().split()) >= X86_64_V3:
        pytest.skip("needs an x86-64 CPU that runs x86-64-v3 (AVX2, FMA) code")
    flags = ("-O3", "-march=x86-64-v3", "-ffast-math")
    name = native.build_name(flags).replace("kvledger_cpu_ops_", "kvledger_cpu_ops_v3_")
    portable = native.build_extension(name, native.SOURCES, list(flags)).require("the tests")
    built = native.load().require("the tests")  # the test machines build it
    return portable, built


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size", "window"),
    [(8, 2, 32, 16, 0), (9, 3, 64, 32, 37), (6, 1, 128, 8, 0)],
)
def test_paged_decode_without_avx512_equals_the_reference_and_this_cpus_build(
    modules, heads: int, kv_heads: int, dim: int, block_size: int, window: int
) -> None:
    portable, built = modules
    gen = torch.Generator().manual_seed(heads * dim)
    k_cache = torch.randn(40, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(40, block_size, kv_heads, dim, generator=gen)
    lens = torch.tensor([1, block_size, block_size + 1, 3 * block_size - 1, 7 * block_size])
    tables = torch.randperm(40, generator=gen)[:35].view(5, 7)
    q = torch.randn(5, heads, dim, generator=gen)
    args = (q, k_cache, v_cache, tables, lens, window, dim**-0.5)
    got = portable.paged_decode(*args)
    torch.testing.assert_close(got.double(), reference(*args), atol=1e-5, rtol=0)
    torch.testing.assert_close(got, built.paged_decode(*args), atol=1e-5, rtol=0)


def test_shared_prefix_decode_without_avx512_equals_the_reference_and_this_cpus_build(
    modules,
) -> None:
    """The grouped kernel's portable loops (`worker/csrc/shared_prefix.h`)."""
    portable, built = modules
    for heads, kv_heads, dim in ((9, 3, 64), (6, 2, 48)):
        args, group_of, group_blocks = shared_prefix_layout(
            heads, kv_heads, dim, 16, torch.float32, dim
        )
        got = portable.paged_decode_shared(*args, group_of, group_blocks)
        torch.testing.assert_close(got.double(), reference(*args), atol=1e-5, rtol=0)
        expected = built.paged_decode_shared(*args, group_of, group_blocks)
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)


def test_a_bfloat16_cache_without_avx512_equals_the_reference(modules) -> None:
    """float32 queries over a bfloat16 cache (--kv-cache-dtype bfloat16) in the portable
    loops: the widened cache's attention, grouped or not."""
    portable, built = modules
    args, group_of, group_blocks = shared_prefix_layout(9, 3, 64, 16, torch.float32, 5)
    q, k, v, *rest = args
    narrow = (q, k.bfloat16(), v.bfloat16(), *rest)
    expected = reference(q, k.bfloat16().float(), v.bfloat16().float(), *rest)
    for got in (
        portable.paged_decode_shared(*narrow, group_of, group_blocks),
        portable.paged_decode(*narrow),
    ):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)
    built_out = built.paged_decode_shared(*narrow, group_of, group_blocks)
    torch.testing.assert_close(
        portable.paged_decode_shared(*narrow, group_of, group_blocks), built_out, atol=2e-6, rtol=0
    )


def test_argmax_without_avx512_takes_the_first_maximum(modules) -> None:
    portable, _ = modules
    logits = torch.randn(5, 30522, generator=torch.Generator().manual_seed(3))
    logits[1, 17] = logits[1, 900] = logits[1].max() + 1  # a tie: the first index wins
    assert portable.argmax_rows(logits).tolist() == torch.argmax(logits, dim=-1).tolist()
