"""Shared-prefix (cascade) decode attention on CPU: decoding sequences whose tables begin with
the same blocks attend over them once per group (`worker/csrc/shared_prefix.h`), grouped by
`worker/attention/shared_prefix.py`. Grouped or not, the kernel equals attention over each
query's visible keys; it refuses a group its tables or contexts contradict; and a real decode
through grouped sequences equals the torch backend."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.worker.attention_reference import reference, shared_prefix_layout
from tests.worker.helpers import greedy_decode, logits_for, make_runner, random_tokens
from worker import native
from worker.attention.cpu_backend import CpuPagedAttention
from worker.attention.shared_prefix import PrefixGroups, shared_prefix_groups
from worker.runner.batch import SeqChunk


@pytest.fixture(scope="module")
def module():
    built = native.load().require("the tests")  # the test machines build it
    return built


def test_groups_are_sequences_sharing_their_first_blocks() -> None:
    tables = [
        [7, 8, 9, 20],  # group 0: 7 8 9 shared by all three
        [7, 8, 9, 21, 22],
        [7, 8, 9, 23],
        [30, 31],  # alone: its first block is nobody else's
        [40, 41, 42],  # group 1: 40 41, then they branch
        [40, 41, 43],
        [50],  # a first block shared, but one context does not cover it whole
        [50],
    ]
    lens = [60, 75, 55, 20, 40, 45, 16, 15]
    groups = shared_prefix_groups(tables, lens, block_size=16)
    assert groups == PrefixGroups(group_of=[0, 0, 0, -1, 1, 1, -1, -1], blocks=[3, 2])


def test_a_short_context_cuts_its_groups_shared_length() -> None:
    # the third sequence's context covers two whole blocks: the group shares two, not three
    tables = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3]]
    groups = shared_prefix_groups(tables, [60, 60, 47], block_size=16)
    assert groups == PrefixGroups(group_of=[0, 0, 0], blocks=[2])
    assert shared_prefix_groups(tables, [60, 60, 47], 16, min_rows=4).blocks == []
    # one prefill chunk of 5 rows is a group of its own; one decode row is not
    alone = shared_prefix_groups([[1, 2, 3]], [40], 16, rows=[5])
    assert alone == PrefixGroups(group_of=[0], blocks=[2])
    assert shared_prefix_groups([[1, 2, 3]], [40], 16).blocks == []


def test_a_prompt_sharing_only_its_first_block_forms_a_group_of_its_own() -> None:
    """Two system prompts that begin with the same block: four chats on the first (10 blocks),
    two on the second; grouping by the first block alone would share one block."""
    first = list(range(10))
    second = [0, *range(20, 29)]
    tables = [first + [40 + i] for i in range(4)] + [second + [50 + i] for i in range(2)]
    groups = shared_prefix_groups(tables, [170] * 6, block_size=16)
    assert groups == PrefixGroups(group_of=[0, 0, 0, 0, 1, 1], blocks=[10, 10])
    # a lone sequence on the second prompt: no group for it, the others keep their 10 blocks
    lone = shared_prefix_groups(tables[:5], [170] * 5, block_size=16)
    assert lone == PrefixGroups(group_of=[0, 0, 0, 0, -1], blocks=[10])


def test_which_prefill_chunks_attend_as_rows() -> None:
    """Up to 256 tokens over a cached prefix at least 4x as long, with no sliding window."""
    backend = CpuPagedAttention(kernel=lambda *a: None)
    starts, lens = [400, 48, 47, 0, 1024, 1028, 16, 64, 64], [36, 12, 12, 8, 256, 257, 4, 20, 16]
    meta = SimpleNamespace(
        start_pos_list=starts, query_lens_list=lens, sliding_window=None, block_size=16
    )
    rows = [backend.attends_as_rows(meta, i) for i in range(len(starts))]
    assert rows == [True, True, False, False, True, False, True, False, True]
    windowed = SimpleNamespace(**{**vars(meta), "sliding_window": 4096})
    assert not backend.attends_as_rows(windowed, 0)
    backend.share_prefixes = False
    assert not backend.attends_as_rows(meta, 0)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (8, 2, 32, 16), (4, 4, 128, 8), (6, 2, 48, 16), (12, 1, 64, 32)],
)
def test_grouped_kernel_equals_the_reference_and_each_sequence_alone(
    module, heads: int, kv_heads: int, dim: int, block_size: int
) -> None:
    args, group_of, group_blocks = shared_prefix_layout(
        heads, kv_heads, dim, block_size, torch.float32, dim
    )
    expected = reference(*args)
    alone = module.paged_decode(*args)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2, 4):  # from 2 threads a group's shared blocks split into parts
            torch.set_num_threads(n_threads)
            got = module.paged_decode_shared(*args, group_of, group_blocks)
            torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)
            torch.testing.assert_close(got, alone, atol=2e-6, rtol=0)
            # the grouped path ran: its sums in another order leave some last bits apart
            assert not torch.equal(got, alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size", "members", "shared", "threads"),
    [
        # 2 (sequence, KV head) tasks on 4 threads: a member's own blocks split into parts
        # (only the first starts from the prefix state), the shared ones into more parts
        # than there are blocks
        (4, 1, 64, 16, 2, 3, 4),
        # 72 rows (two passes of 64 and 8), keys past the first 128-key chunk (its state
        # rescaled), chunks of 126 keys (a tail of 2 under the 4-key step)
        (8, 1, 32, 6, 9, 25, 2),
        # blocks longer than a chunk: one block a chunk
        (6, 2, 64, 256, 3, 1, 2),
        # 300 rows a KV head: two row blocks (256 + 44), a member's heads across the cut
        (9, 3, 64, 16, 100, 3, 2),
        # 2 tasks of unequal rows (256, 44) on 4 threads: each cut into 4 parts of 2 blocks
        (4, 1, 64, 16, 75, 2, 4),
    ],
)
def test_grouped_kernel_edges_equal_the_reference(
    module,
    heads: int,
    kv_heads: int,
    dim: int,
    block_size: int,
    members: int,
    shared: int,
    threads: int,
) -> None:
    gen = torch.Generator().manual_seed(members * shared)
    num_blocks = shared + 2 * members + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    tables = [list(range(shared)) + [shared + 2 * i, shared + 2 * i + 1] for i in range(members)]
    tables.append([num_blocks - 3, num_blocks - 2, num_blocks - 1])  # alone
    lens = [shared * block_size + 1 + (5 * i) % (2 * block_size - 1) for i in range(members)]
    lens.append(3 * block_size - 1)
    groups = shared_prefix_groups(tables, lens, block_size)
    assert groups.blocks == [shared] and groups.group_of.count(0) == members
    width = max(map(len, tables))
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(tables), heads, dim, generator=gen)
    args = (q, k_cache, v_cache, padded, torch.tensor(lens), 0, dim**-0.5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = module.paged_decode_shared(
            *args, torch.tensor(groups.group_of), torch.tensor(groups.blocks)
        )
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got.double(), reference(*args), atol=1e-5, rtol=0)


def test_grouped_kernel_in_bfloat16(module) -> None:
    args, group_of, group_blocks = shared_prefix_layout(9, 3, 64, 16, torch.bfloat16, 5)
    got = module.paged_decode_shared(*args, group_of, group_blocks)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), reference(*args), atol=2e-2, rtol=0)


def test_the_kernel_refuses_a_group_its_tables_contradict(module) -> None:
    args, group_of, group_blocks = shared_prefix_layout(8, 2, 32, 16, torch.float32, 1)
    q, k_cache, v_cache, tables, lens, window, scale = args

    def call(**change):  # noqa: ANN003, ANN202
        given = dict(tables=tables, lens=lens, window=window, of=group_of, blocks=group_blocks)
        given |= change
        tables_, lens_, window_ = given["tables"], given["lens"], given["window"]
        return module.paged_decode_shared(
            q, k_cache, v_cache, tables_, lens_, window_, scale, given["of"], given["blocks"]
        )

    other = tables.clone()
    other[1, 3] = other[1, 3] + 1  # sequence 1's fourth block is not group 0's
    with pytest.raises(RuntimeError, match="not its group's shared block"):
        call(tables=other)
    with pytest.raises(RuntimeError, match="does not hold group 0's 10 shared blocks"):
        call(blocks=torch.tensor([10, 1]))
    short = lens.clone()
    short[0] = 6 * 16 - 1  # the last shared block's last key is past its context
    with pytest.raises(RuntimeError, match="does not hold"):
        call(lens=short)
    with pytest.raises(RuntimeError, match="sliding window"):
        call(window=40)
    with pytest.raises(RuntimeError, match="out of range"):
        call(of=torch.where(group_of == 1, 2, group_of))
    with pytest.raises(RuntimeError, match="one group"):
        call(of=group_of[:-1])
    with pytest.raises(RuntimeError, match="group 1 has no sequence"):
        call(of=torch.where(group_of == 1, -1, group_of))
    with pytest.raises(RuntimeError, match="group 0 has no sequence"):
        call(of=torch.full_like(group_of, -1), blocks=torch.tensor([1]))
    with pytest.raises(RuntimeError, match="int64"):
        call(blocks=group_blocks.int())


def test_decoding_sequences_on_a_shared_prefix_equal_the_torch_backend(
    module, tiny_llama_dir
) -> None:
    """Five chats on one 3-block system prompt (written once, as the prefix cache shares it),
    decoded greedily step by step: the CPU kernel, which groups them, gives the torch
    reference's tokens and logits."""
    prefix = random_tokens(48, 30522, seed=11)
    tails = [random_tokens(n, 30522, seed=20 + n) for n in (3, 17, 20, 33, 9)]
    formed: list[list[int]] = []

    def decode(runner) -> tuple[list[list[int]], torch.Tensor]:  # noqa: ANN001
        tables = [[0, 1, 2] + list(range(3 + 4 * i, 7 + 4 * i)) for i in range(5)]
        seqs = [prefix + tail for tail in tails]
        runner.execute([SeqChunk("s0", seqs[0], 0, tables[0], False)])
        runner.execute([SeqChunk(f"s{i}", seqs[i][48:], 48, tables[i], False) for i in range(1, 5)])
        return seqs, greedy_decode(runner, seqs, tables, 8)

    ref_seqs, ref_logits = decode(make_runner(tiny_llama_dir, num_blocks=32))
    runner = make_runner(tiny_llama_dir, num_blocks=32, attention_backend="cpu")
    backend = runner.backend
    assert isinstance(backend, CpuPagedAttention)
    plain = backend.decode_group

    def recording(meta, seqs, rows, positions):  # noqa: ANN001, ANN202
        group = plain(meta, seqs, rows, positions)
        formed.append(group.group_blocks.tolist())
        return group

    backend.decode_group = recording
    seqs, logits = decode(runner)
    # every decode step grouped, and the prefill of the one tail under a quarter of the
    # prompt (9 tokens) as rows too
    assert len(formed) == 9 and all(blocks == [3] for blocks in formed)
    assert seqs == ref_seqs
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)


def test_chunks_over_a_cached_prefix_attend_as_rows_with_the_decodes(
    module, tiny_llama_dir
) -> None:
    """One step of: a chat's 16 own tokens after a cached 4-block system prompt and another's
    8 starting mid-block (rows of the kernel, grouped with the decodes on that prompt), two
    decodes on it, a cold prefill and a chunk longer than its cached prefix (both SDPA).
    Every token's logits equal the torch backend's."""
    prefix = random_tokens(64, 30522, seed=31)
    chats = [prefix + random_tokens(n, 30522, seed=40 + n) for n in (16, 5, 9, 14)]
    cold = random_tokens(30, 30522, seed=50)
    long_chunk = random_tokens(16, 30522, seed=51) + random_tokens(40, 30522, seed=52)
    seen: list = []

    def step(runner) -> torch.Tensor:  # noqa: ANN001
        tables = [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3, 6], [0, 1, 2, 3, 13]]
        runner.execute([SeqChunk("c0", chats[1], 0, tables[1], False)])  # writes the prompt
        runner.execute([SeqChunk("c2", chats[2][64:-1], 64, tables[2], False)])
        runner.execute([SeqChunk("c3", chats[3][64:70], 64, tables[3], False)])
        runner.execute([SeqChunk("l", long_chunk[:16], 0, [7, 8, 9, 10], False)])
        chunks = [
            SeqChunk("c1", chats[0][64:], 64, tables[0], True),  # 16 rows over 64 cached
            SeqChunk("c0", chats[1][-1:], len(chats[1]) - 1, tables[1], True),
            SeqChunk("c3", chats[3][70:], 70, tables[3], True),  # 8 rows from mid-block
            SeqChunk("cold", cold, 0, [11, 12], True),
            SeqChunk("l", long_chunk[16:], 16, [7, 8, 9, 10], True),  # 40 over 16 cached
            SeqChunk("c2", chats[2][-1:], len(chats[2]) - 1, tables[2], True),
        ]
        return logits_for(runner, chunks, all_tokens=True)

    expected = step(make_runner(tiny_llama_dir, num_blocks=16))
    runner = make_runner(tiny_llama_dir, num_blocks=16, attention_backend="cpu")
    plan = runner.backend.plan

    def recording(meta):  # noqa: ANN001, ANN202
        made = plan(meta)
        seen.append(made)
        return made

    runner.backend.plan = recording
    got = step(runner)
    last = seen[-1]
    assert [p.q_end - p.q_start for p in last.prefills] == [30, 40]  # cold and long: SDPA
    # 16 chat rows, a decode, 8 chat rows, then past the SDPA rows the other decode
    assert last.decode.token_idx.tolist() == [*range(25), 95]
    assert last.decode.group_of.tolist() == [0] * 26 and last.decode.group_blocks.tolist() == [4]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
