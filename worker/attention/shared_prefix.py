"""Groups of decoding sequences that share leading KV blocks, for the CPU kernel's
shared-prefix (cascade) attention (`csrc/shared_prefix.h`).

Sequences whose block tables begin with the same block (a system prompt the prefix cache hands
to every chat) form a group; its shared length is the longest run of leading blocks that all
its tables hold and that every member's context covers whole. The kernel attends over those
blocks once for the whole group and over each sequence's own blocks apart. A prefill chunk
over a cached prefix is as many rows as it has tokens, each seeing the keys up to its own, so
one chunk alone can be a group. Grouping by the
first block is one pass over the tables: sequences that branch later share what they share
before the branch (the group's length is the shortest common run), and a sequence that shares
nothing with any other attends alone, as before.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixGroups:
    group_of: list[int]  # per sequence: its group, or -1
    blocks: list[int]  # per group: the leading blocks its sequences share


def shared_prefix_groups(
    tables: list[list[int]],
    context_lens: list[int],
    block_size: int,
    rows: list[int] | None = None,
    min_rows: int = 2,
) -> PrefixGroups:
    """Groups of sequences sharing at least one whole leading block and holding at least
    `min_rows` query rows between them. `rows[i]`: sequence i's query rows (default one, a
    decode); `context_lens[i]`: the keys its first row sees, the fewest of its rows."""
    rows = rows if rows is not None else [1] * len(tables)
    by_first: dict[int, list[int]] = {}
    for i, table in enumerate(tables):
        if table and context_lens[i] >= block_size:
            by_first.setdefault(table[0], []).append(i)
    group_of = [-1] * len(tables)
    blocks: list[int] = []
    for members in by_first.values():
        if sum(rows[i] for i in members) < min_rows:
            continue
        covered = min(min(len(tables[i]), context_lens[i] // block_size) for i in members)
        shared = 0
        for column in zip(*(tables[i][:covered] for i in members), strict=True):
            if column.count(column[0]) != len(column):
                break
            shared += 1
        for i in members:
            group_of[i] = len(blocks)
        blocks.append(shared)
    return PrefixGroups(group_of, blocks)
