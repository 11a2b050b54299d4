"""Paged attention on CPU with a compiled decode kernel that reads the cache in place.

Decode rows (one new token per sequence: most rows of a serving step) go to
`csrc/paged_decode.cpp`, which walks each sequence's block table inside the KV cache, so
nothing is gathered: the torch reference copies every decoding sequence's blocks in every
layer (`index_select`, then one padded SDPA call), which at batch 1 cost more in per-op
overhead than the arithmetic and at 16 sequences of ~600 tokens moved ~3 MB per layer.
A prefill chunk of up to 256 tokens over a cached prefix at least 4x as long goes there too,
as one row per token (`attends_as_rows`); other prefill chunks keep the torch path (SDPA's
causal kernel over the gathered blocks).

Rows whose sequences share leading blocks (`worker/attention/shared_prefix.py`: a system
prompt the prefix cache serves to every chat) attend over them together, once per group
(`csrc/shared_prefix.h`), and over their own blocks apart: the shared blocks are read once a
group instead of once a sequence (docs/performance.md, "Attention", has the gain).

The kernel computes in float32 with a block-wise online softmax; it equals the torch backend
to ~1e-6 in float32 (`tests/worker/test_cpu_attention.py`), grouped or not
(`tests/worker/test_shared_prefix.py`). A grouped sequence's sums run in another order than
alone, so its output may differ from the ungrouped one in the last bits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from worker.attention.base import AttentionMetadata
from worker.attention.shared_prefix import shared_prefix_groups
from worker.attention.torch_backend import TorchAttention


@dataclass
class KernelDecode:
    token_idx: torch.Tensor  # [n] long: rows of the flat batch
    block_tables: torch.Tensor  # [n, width] long
    context_lens: torch.Tensor  # [n] long: keys each query sees (its position + 1)
    window: int  # sliding window (0: none)
    group_of: torch.Tensor  # [n] long: each row's shared-prefix group, or -1 (or empty)
    group_blocks: torch.Tensor  # [groups] long: the leading blocks each group shares


Kernel = Callable[..., torch.Tensor]
MAX_ROWS_CHUNK = 256  # the longest prefill chunk attended as rows (`attends_as_rows`)


class CpuPagedAttention(TorchAttention):
    name = "cpu"

    def __init__(
        self,
        kernel: Kernel,
        share_prefixes: bool = True,
        write: Callable[..., None] | None = None,
    ) -> None:
        """`kernel`: the compiled `paged_decode_shared`; `share_prefixes` False attends every
        decode alone and every prefill chunk through SDPA (benchmarks compare the two);
        `write`: the compiled `write_kv` (the same copies as torch's `index_copy_` pair in one
        call, without two torch ops' per-call cost in every layer of a decode step), else
        torch's."""
        self.kernel = kernel
        self.share_prefixes = share_prefixes
        if write is not None:
            self.write_kv = write

    def attends_as_rows(self, meta: AttentionMetadata, i: int) -> bool:
        """A chunk of up to 256 tokens over a cached prefix at least 4x as long (a chat's own
        tokens after a shared system prompt) goes to the kernel as rows: every row sees the whole
        prefix, so the prefix is a group's shared blocks (its rows and those of other
        sequences on the same prefix), and only the chunk's own keys are attended row by row.
        Rows win while the shared prefix is most of a chunk's context and lose once the chunk's
        own keys are half of it (docs/performance.md, "Attention"), so below 4x, and from the
        start, SDPA's causal kernel. Its own keys cost rows the square of its length: longer
        chunks (a long prompt's later chunks) stay with SDPA, where rows were not measured."""
        start, q_len = meta.start_pos_list[i], meta.query_lens_list[i]
        return (
            self.share_prefixes
            and meta.sliding_window is None
            and q_len <= MAX_ROWS_CHUNK
            and start >= max(4 * q_len, meta.block_size)
        )

    def decode_group(
        self, meta: AttentionMetadata, seqs: list[int], rows: list[int], positions: list[int]
    ) -> KernelDecode:
        width = max(len(meta.block_tables_list[i]) for i in seqs)
        device = meta.slot_mapping.device
        window = meta.sliding_window or 0
        group_of: list[int] = []
        group_blocks: list[int] = []
        if self.share_prefixes and not window and len(rows) > 1:
            # one entry per sequence (its rows' positions rise: the first sees the fewest keys)
            first: dict[int, int] = {}
            for j, seq in enumerate(seqs):
                first.setdefault(seq, j)
            order, count = list(first), Counter(seqs)
            groups = shared_prefix_groups(
                [meta.block_tables_list[i] for i in order],
                [positions[first[i]] + 1 for i in order],
                meta.block_size,
                rows=[count[i] for i in order],
            )
            if groups.blocks:
                of_seq = dict(zip(order, groups.group_of, strict=True))
                group_of, group_blocks = [of_seq[i] for i in seqs], groups.blocks
        return KernelDecode(
            token_idx=torch.tensor(rows, dtype=torch.long, device=device),
            block_tables=meta.block_tables[seqs, :width].to(torch.long),
            context_lens=torch.tensor([p + 1 for p in positions], dtype=torch.long, device=device),
            window=window,
            group_of=torch.tensor(group_of, dtype=torch.long, device=device),
            group_blocks=torch.tensor(group_blocks, dtype=torch.long, device=device),
        )

    def attend_decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        group: KernelDecode,
        scale: float,
    ) -> torch.Tensor:
        return self.kernel(
            q,
            k_cache,
            v_cache,
            group.block_tables,
            group.context_lens,
            group.window,
            scale,
            group.group_of,
            group.group_blocks,
        )
