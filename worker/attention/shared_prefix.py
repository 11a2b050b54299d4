"""Groups of query rows (decodes, and prefill chunks over a cached prefix) whose sequences
share leading KV blocks, for the CPU kernel's shared-prefix (cascade) attention
(`csrc/shared_prefix.h`).

Sequences whose block tables begin with the same block (a system prompt the prefix cache hands
to every chat) form a group; its shared length is the longest run of leading blocks that all
its tables hold and that every member's context covers whole. The kernel attends over those
blocks once for the whole group and over each sequence's own blocks apart. A prefill chunk
over a cached prefix is as many rows as it has tokens, each seeing the keys up to its own, so
one chunk alone can be a group. Sequences are grouped by their first block; within such a
bucket, those that agree with its leader over less than half of the leader's blocks (another
system prompt that begins with the same block) are grouped again among themselves, so one
of them cannot cut the others' shared length to a block. Sequences that branch later share
what they share before the branch (a group's length is its shortest common run with the
leader), and a sequence that shares nothing with any other attends alone.
"""

from __future__ import annotations

from collections import deque
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
    covered = [min(len(t), n // block_size) for t, n in zip(tables, context_lens, strict=True)]
    by_first: dict[int, list[int]] = {}
    for i, table in enumerate(tables):
        if covered[i] >= 1:
            by_first.setdefault(table[0], []).append(i)
    group_of = [-1] * len(tables)
    blocks: list[int] = []
    pending = deque(by_first.values())
    while pending:
        members = pending.popleft()
        if sum(rows[i] for i in members) < min_rows:
            continue
        # The leader (most rows, then the longest context) sets the run to share: a member
        # agreeing with it over less than half of it would cut everyone's shared length (two
        # system prompts that begin with the same block), so it tries again with the others.
        leader = max(members, key=lambda i: (rows[i], covered[i]))
        lead = tables[leader][: covered[leader]]
        runs = {i: _common_run(tables[i][: covered[i]], lead) for i in members}
        rest = [i for i in members if 2 * runs[i] < len(lead)]
        if rest:
            pending.append(rest)
        keep = [i for i in members if 2 * runs[i] >= len(lead)]
        if sum(rows[i] for i in keep) < min_rows:
            continue
        for i in keep:
            group_of[i] = len(blocks)
        blocks.append(min(runs[i] for i in keep))
    return PrefixGroups(group_of, blocks)


def _common_run(table: list[int], lead: list[int]) -> int:
    """How many leading blocks `table` and `lead` agree on."""
    run = 0
    for a, b in zip(table, lead, strict=False):
        if a != b:
            break
        run += 1
    return run
