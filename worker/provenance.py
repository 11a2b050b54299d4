"""The provenance check: what this worker vouches each block holds, and what one plan may read.

The worker records, per physical block, the hash the scheduler declared when the block's
content was written, and forgets it as soon as a plan hands the block out as fresh (its content
is about to be overwritten). A plan's claim on a cached block is read only if the recorded hash
is the declared one: a scheduler that believes a block still holds a prefix after it was
evicted and reused is caught here, across the process boundary, before anything reads it.

A claim may also name a block that another request of the same plan writes in this step
(same-step sharing, docs/design.md, "The ledger"): every layer writes all new K/V before any
query reads the cache, so such a claim holds if, and only if, that writer really runs. What a
plan declares is recorded only after the plan ran, and only for requests that did run and
wrote KV.

Pure: no wire messages, no torch, no clock.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from worker.link.step import BlockHashPair, StepPlan


class Provenance:
    """block id -> hash of the content this worker wrote there, as the scheduler declared it."""

    def __init__(self) -> None:
        self._hashes: dict[int, bytes] = {}

    def recorded(self) -> dict[int, bytes]:
        """A copy of what the worker vouches for now."""
        return dict(self._hashes)

    def clear(self) -> None:
        """After a reconnect the KV memory counts as empty (the scheduler was told all_cleared)."""
        self._hashes.clear()

    def record(self, blocks: Iterable[BlockHashPair]) -> None:
        """These blocks now hold the declared content (their plan ran and wrote them)."""
        self._hashes.update(blocks)

    def forget(self, block_ids: Iterable[int]) -> None:
        """These blocks are about to be overwritten, or were refused: what was recorded of them
        is no longer true."""
        for block_id in block_ids:
            self._hashes.pop(block_id, None)

    def verify(
        self, request_id: str, claimed: Iterable[BlockHashPair], step: PlanWrites
    ) -> list[int]:
        """The claimed blocks this request may not read: each must hold the declared hash, either
        recorded from an earlier step or written earlier in this one by another request with
        that very hash. Empty: every claim holds, and the same-step writers it reads from are
        noted in `step` (their failure refuses it in turn)."""
        mismatched: list[int] = []
        writers: set[str] = set()
        for block_id, block_hash in claimed:
            declared = step.pending.get(block_id)
            if declared is not None and declared[1] != request_id:
                if declared[0] == block_hash:
                    writers.add(declared[1])  # written earlier in this very step
                else:
                    mismatched.append(block_id)
            elif self._hashes.get(block_id) != block_hash:
                mismatched.append(block_id)
        if not mismatched and writers:
            step.reads_from[request_id] = writers
        return mismatched


@dataclass
class PlanWrites:
    """What one plan declares written, who reads those writes, and what became of each request.

    `failed` (errored or refused) and `void` (continuations of a request failed in an earlier
    plan, skipped) wrote nothing the worker vouches for; `no_kv` ran but kept no KV (embedding
    passes).
    """

    # block id -> (hash, request) for blocks written in this step by a request that computes KV
    pending: dict[int, tuple[bytes, str]]
    # request -> requests whose same-step writes it reads
    reads_from: dict[str, set[str]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    void: set[str] = field(default_factory=set)
    no_kv: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, plan: StepPlan, voided: Container[str]) -> PlanWrites:
        """Blocks this plan declares written, by request; a void continuation writes nothing,
        and neither does an embedding request."""
        pending: dict[int, tuple[bytes, str]] = {}
        for new in plan.new:
            if new.embed is None:
                pending.update((b, (h, new.request_id)) for b, h in new.written)
        for cont in plan.cont:
            if cont.request_id not in voided:
                pending.update((b, (h, cont.request_id)) for b, h in cont.written)
        return cls(pending)

    def unwritten_reads(self, tables: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """Requests (of `tables`, request id -> block table) reading blocks that a failed
        request of this step was to write, and, in turn, any request reading their writes:
        request id -> the same-step blocks of its table it would have read, in the order
        found. They are to be refused (recomputed later); each is added to `failed`."""
        refused: dict[str, list[int]] = {}
        live = dict(tables)
        while True:
            blocked = [rid for rid in live if self.reads_from.get(rid, set()) & self.failed]
            if not blocked:
                return refused
            for rid in blocked:
                writers = self.reads_from[rid]
                refused[rid] = [
                    b for b, (_, w) in self.pending.items() if w in writers and b in live[rid]
                ]
                self.failed.add(rid)
            live = {rid: table for rid, table in live.items() if rid not in self.failed}

    def settle(self, plan: StepPlan) -> tuple[list[BlockHashPair], list[int]]:
        """After the plan ran: the declared blocks really written (to record and report
        stored), and those an embedding pass was declared to fill but never wrote (to report
        removed: the scheduler believes they hold KV). A failed request's declarations are
        neither: the scheduler forgets them itself, as it does a void continuation's."""
        written: list[BlockHashPair] = []
        unwritten: list[int] = []
        for item in plan.items():
            if item.request_id in self.void:
                continue
            if item.request_id in self.no_kv:
                unwritten.extend(b for b, _ in item.written)
            elif item.request_id not in self.failed:
                written.extend(item.written)
        return written, unwritten
