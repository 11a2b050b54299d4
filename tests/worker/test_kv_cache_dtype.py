"""A bfloat16 KV cache under a float32 model (`--kv-cache-dtype bfloat16`, CPU).

The rule: keys and values are rounded to bfloat16 once, as they are written (to nearest
even, as torch rounds), and every reader widens them back to float32 exactly. So the compiled
kernel on a bfloat16 cache computes bit for bit what it computes on a float32 cache holding
the widened values, grouped or not (its AVX-512 forms; within 1e-6 in the portable loops);
the torch backend agrees with it as on float32; the cache read after a prefix hit is what a
full prefill reads (cache on equals cache off); and the model's logits move from the float32
cache's by the rounding of the keys and values alone, a bound measured here. A cache dtype
the worker cannot serve stops it at start.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.worker.attention_reference import reference, shared_prefix_layout
from tests.worker.helpers import greedy, logits_for, make_runner, random_tokens, run_mixed
from worker import native
from worker.attention.torch_backend import write_kv
from worker.runner.batch import SeqChunk
from worker.runner.kv_cache import KVShape, kv_dtype

CPU = torch.device("cpu")
# the module is built for this CPU (-march=native): its AVX-512 forms exist only here
AVX512 = "avx512f" in native._cpu_flags().split()


@pytest.fixture(scope="module")
def module():
    built = native.load().require("the tests")  # the test machines build it
    return built


def widened(args: tuple) -> tuple[tuple, tuple]:
    """The kernel's arguments with bfloat16 caches, and with those caches widened to float32."""
    q, k, v, *rest = args
    k16, v16 = k.bfloat16(), v.bfloat16()
    return (q, k16, v16, *rest), (q, k16.float(), v16.float(), *rest)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (8, 2, 32, 16), (4, 4, 128, 8), (6, 2, 48, 16)],  # 48: portable loops
)
def test_a_bfloat16_cache_reads_as_its_float32_widening_bit_for_bit(
    module, heads: int, kv_heads: int, dim: int, block_size: int
) -> None:
    args, group_of, group_blocks = shared_prefix_layout(
        heads, kv_heads, dim, block_size, torch.float32, dim
    )
    narrow, wide = widened(args)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):  # one task a thread, or a group's shared blocks in parts
            torch.set_num_threads(n_threads)
            got = module.paged_decode_shared(*narrow, group_of, group_blocks)
            assert got.dtype == torch.float32
            same = module.paged_decode_shared(*wide, group_of, group_blocks)
            alone, alone_wide = module.paged_decode(*narrow), module.paged_decode(*wide)
            if AVX512 and dim in (32, 64, 128):  # the AVX-512 forms: same operations, values
                assert torch.equal(got, same) and torch.equal(alone, alone_wide)
            else:  # the portable loops, which the compiler vectorizes per dtype
                torch.testing.assert_close(got, same, atol=1e-6, rtol=0)
                torch.testing.assert_close(alone, alone_wide, atol=1e-6, rtol=0)
            torch.testing.assert_close(got.double(), reference(*wide), atol=1e-5, rtol=0)
    finally:
        torch.set_num_threads(threads)


def test_a_float16_model_reads_its_float16_cache(module) -> None:
    """A 16-bit model's own cache (queries and cache in float16) takes the widening loads too."""
    args, group_of, group_blocks = shared_prefix_layout(9, 3, 64, 16, torch.float16, 7)
    got = module.paged_decode_shared(*args, group_of, group_blocks)
    assert got.dtype == torch.float16
    expected = reference(*args)
    torch.testing.assert_close(got.double(), expected, atol=2e-3, rtol=0)
    alone = module.paged_decode(*args)
    torch.testing.assert_close(alone.double(), expected, atol=2e-3, rtol=0)


def test_the_kernel_refuses_caches_of_another_dtype(module) -> None:
    args, _, _ = shared_prefix_layout(8, 2, 32, 16, torch.float32, 1)
    q, k, v, *rest = args
    for cache_dtype, q_dtype in ((torch.float16, torch.float32), (torch.bfloat16, torch.float16)):
        with pytest.raises(RuntimeError, match="bfloat16 under float32 q"):
            module.paged_decode(q.to(q_dtype), k.to(cache_dtype), v.to(cache_dtype), *rest)
    with pytest.raises(RuntimeError, match="share q's dtype"):
        module.paged_decode(q, k.bfloat16(), v, *rest)


def test_the_compiled_write_rounds_as_torch_does(module) -> None:
    gen = torch.Generator().manual_seed(5)
    k = torch.randn(7, 3, 64, generator=gen) * 10
    v = torch.randn(7, 3, 64, generator=gen) * 1e-3
    k[0, 0, :4] = torch.tensor([float("inf"), -float("inf"), 1 + 2**-8, 1 + 3 * 2**-8])  # ties
    slots = torch.tensor([5, 0, 17, 3, 30, 31, 8])
    caches = [torch.full((4, 8, 3, 64), 7.0, dtype=torch.bfloat16) for _ in range(4)]
    module.write_kv(k, v, caches[0], caches[1], slots)
    write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    flat = caches[0].view(-1, 3, 64)
    assert torch.equal(flat[slots], k.bfloat16())
    assert torch.equal(flat[1], torch.full((3, 64), 7.0, dtype=torch.bfloat16))  # untouched
    with pytest.raises(RuntimeError, match="k and v must be BFloat16"):
        module.write_kv(k.double(), v.double(), caches[0], caches[1], slots)
    with pytest.raises(RuntimeError, match="k and v must share a dtype"):
        module.write_kv(k, v.bfloat16(), caches[0], caches[1], slots)


def test_the_cache_dtype_follows_the_model_or_is_refused_at_start() -> None:
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert kv_dtype("auto", f32, CPU) == f32 and kv_dtype("auto", bf16, CPU) == bf16
    assert kv_dtype("bfloat16", f32, CPU) == bf16 and kv_dtype("bfloat16", bf16, CPU) == bf16
    assert kv_dtype("float32", f32, CPU) == f32
    for name, dtype, device in (
        ("bfloat16", f32, torch.device("cuda")),  # flash-attn reads the queries' dtype
        ("bfloat16", f16, CPU),
        ("float32", bf16, CPU),
    ):
        with pytest.raises(ValueError, match="needs a float32 model on CPU"):
            kv_dtype(name, dtype, device)
    with pytest.raises(ValueError, match="unsupported KV cache dtype"):
        kv_dtype("float16", f32, CPU)
    # half the bytes a block: twice the blocks for a budget
    shape = KVShape(4, 16, 2, 64, f32)
    half = KVShape(4, 16, 2, 64, bf16)
    assert half.bytes_per_block() * 2 == shape.bytes_per_block()
    assert half.blocks_for_budget(1 << 24) == 2 * shape.blocks_for_budget(1 << 24)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_the_runner_keeps_bfloat16_keys_and_computes_in_float32(
    hf_checkpoint, backend: str
) -> None:
    path: Path = hf_checkpoint("llama")
    runner = make_runner(path, num_blocks=24, kv_cache_dtype="bfloat16", attention_backend=backend)
    assert runner.kv_dtype == torch.bfloat16 and runner.dtype == torch.float32
    assert all(k.dtype == torch.bfloat16 for k in runner.kv_cache.k)
    got = run_mixed(runner)
    # the two backends read the same rounded cache: they agree as on a float32 one
    if backend == "cpu":
        ref = run_mixed(make_runner(path, num_blocks=24, kv_cache_dtype="bfloat16"))
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # against the float32 cache: the keys' and values' rounding (2^-9 relative) alone
    full = run_mixed(make_runner(path, num_blocks=24, attention_backend=backend))
    scale = full.abs().max().item()
    assert (got - full).abs().max().item() <= 5e-3 * scale  # measured: 8e-4 x the largest


def test_a_prefix_hit_reads_what_a_full_prefill_wrote(hf_checkpoint) -> None:
    """Cache on equals cache off: a prompt whose first blocks are already in the cache
    (written by another request) gives the logits of the same prompt prefilled whole."""
    path: Path = hf_checkpoint("llama")
    prompt = random_tokens(53, 256, seed=11)
    cold = make_runner(path, num_blocks=24, kv_cache_dtype="bfloat16", attention_backend="cpu")
    whole = logits_for(cold, [SeqChunk("a", prompt, 0, [0, 1, 2, 3], True)], all_tokens=True)
    warm = make_runner(path, num_blocks=24, kv_cache_dtype="bfloat16", attention_backend="cpu")
    other = prompt[:32] + random_tokens(9, 256, seed=12)
    warm.execute([SeqChunk("o", other, 0, [0, 1, 5], False)])  # writes blocks 0 and 1
    hit = logits_for(warm, [SeqChunk("a", prompt[32:], 32, [0, 1, 2, 3], True)], all_tokens=True)
    torch.testing.assert_close(hit, whole[32:], atol=1e-5, rtol=0)


def test_greedy_tokens_stay_those_of_the_float32_cache(hf_checkpoint) -> None:
    path: Path = hf_checkpoint("llama")
    prompt = random_tokens(40, 256, seed=3)
    f32 = greedy(make_runner(path, num_blocks=24, attention_backend="cpu"), prompt, 12)
    bf16_runner = make_runner(
        path, num_blocks=24, kv_cache_dtype="bfloat16", attention_backend="cpu"
    )
    assert greedy(bf16_runner, prompt, 12) == f32


def test_the_flag_reaches_the_runner_and_a_pair_it_cannot_serve_stops_startup(
    hf_checkpoint,
) -> None:
    from kvledger.flags import WORKER, config_for, parse
    from worker.runner.base import load_runner
    from worker.runner.config import runner_config

    path = hf_checkpoint("llama")
    default = runner_config(config_for(WORKER, parse(WORKER, [], "")), path)
    assert default.kv_cache_dtype == "auto"
    argv = ["--kv-cache-dtype", "bfloat16", "--num-kv-blocks", "8"]
    config = runner_config(config_for(WORKER, parse(WORKER, argv, "")), path)
    runner = load_runner(dataclasses.replace(config, progress=False))
    assert runner.kv_dtype == torch.bfloat16 and runner.kv_cache.k[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="needs a float32 model on CPU"):
        make_runner(hf_checkpoint("llama"), dtype="bfloat16", kv_cache_dtype="float32")
