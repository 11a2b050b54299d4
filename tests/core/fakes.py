"""A fake worker that checks every plan against the protocol.

The fake keeps what a real worker keeps (per-request tables and tokens, the hash declared for
each written block) and, beside it, the truth: which token prefix (and salt) each block really
holds. A claimed block whose truth differs from the request's prefix is a stale entry the
scheduler let through, and fails the test at once. So does a claim the worker has to refuse
for a reason no injected fault explains: refusing it would only hide the scheduler's mistake.
The scheduler it serves and the stepping loop live in tests/core/harness.py.

Why this file is longer than the project's ~300 lines: it is one fake worker, whose checks
(claims, writes, refusals, drafts kept or rejected) all read and update the same truth about
each block; split, each part would reach into state the others keep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import chain

from scheduler_svc.core import ModelResult, Request, SchedulerOutput
from scheduler_svc.core.block_hash import extend_chain, request_extra_keys
from scheduler_svc.core.output import BlockHashPair

Truth = tuple[str | None, tuple[int, ...]]  # (salt, every token up to the block's end)
CORRUPT = b"?" * 32  # a provenance record no real hash matches


def default_token(rid: str, tokens: list[int]) -> int:
    return 1000 + len(tokens)


@dataclass
class FakeWorker:
    block_size: int
    kv: bool = True  # False: no tables at all (the no-KV manager)
    late: bool = False  # async scheduling: a block may be declared written after its step
    next_token: Callable[[str, list[int]], int] = default_token
    requests: dict[str, Request] = field(default_factory=dict)  # every request ever added
    tables: dict[str, list[int]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)
    declared: dict[int, bytes] = field(default_factory=dict)  # provenance, as a worker keeps
    truth: dict[int, Truth | None] = field(default_factory=dict)  # what a block really holds
    claims_checked: int = 0
    # Requests this worker failed or refused: under async scheduling a plan already in flight
    # may still continue them; like the real worker, it skips them until a plan drops them.
    voided: set[str] = field(default_factory=set)
    committed: dict[str, int] = field(default_factory=dict)  # blocks declared, per request
    # What the worker itself put in `declared`. A test may overwrite a record (a fault), and
    # only a record that differs from this one may justify refusing a claim.
    recorded: dict[int, bytes] = field(default_factory=dict)
    _hashes: dict[Truth, bytes] = field(default_factory=dict)

    def corrupt(self, block: int) -> None:
        """A fault: the provenance record of this block disagrees with what it holds."""
        self.declared[block] = CORRUPT

    def run(
        self,
        out: SchedulerOutput,
        errored: dict[str, str] | None = None,
        drop_blocks: Iterable[int] = (),
        withhold: Iterable[str] = (),
        excused: frozenset[BlockHashPair] = frozenset(),
        deferred: Iterable[str] = (),
    ) -> ModelResult:
        """`excused`: writes that failed in an earlier step after this plan was made (two
        plans in flight): a claim on them is refused for a reason the test caused."""
        for rid in out.dropped_request_ids:
            self._forget(rid)
            self.voided.discard(rid)
        # what a voided continuation declares is never written: claims on it are explained
        excused = excused | written_by(out, self.voided)
        out = _without(out, self.voided)
        for new in out.new:
            self._place(new.request_id, new.token_ids, new.block_ids, new.num_computed_tokens)
            assert new.num_computed_tokens == len(new.claimed) * self.block_size
            assert [b for b, _ in new.claimed] == new.block_ids[: len(new.claimed)]
        for cont in out.cont:
            rid = cont.request_id
            assert rid in self.tables, f"continuing {rid}, which the worker does not hold"
            assert cont.num_computed_tokens == self.computed[rid], f"{rid}: computed mismatch"
            self.tables[rid].extend(cont.new_block_ids)
        held = {item.request_id for item in chain(out.new, out.cont)}
        errored = {rid: why for rid, why in (errored or {}).items() if rid in held}
        # deferred (their grammar still compiling): not run, like an error, but requeued
        later = {rid: "" for rid in deferred if rid in held and rid not in errored}
        refused = self._refused_claims(out, {**errored, **later}, excused)
        deferred = set(later) - refused  # the real worker checks provenance first
        failed = refused | set(errored) | deferred
        unwritten = written_by(out, failed) | excused
        # a block written now may also be claimed now (same-step sharing), nothing else
        shared_now = {b for new in out.new for b, _ in new.claimed} & {
            b for item in chain(out.new, out.cont) for b, _ in item.written
        }
        for item in chain(out.new, out.cont):
            if item.request_id not in failed:
                drafts = getattr(item, "draft_token_ids", [])
                self._write(
                    item.request_id, item.num_scheduled_tokens, item.written, shared_now, drafts
                )
        for new in out.new:
            self._check_claims(new.request_id, new.claimed, unwritten)
        result = ModelResult(errored=errored, stale_request_ids=sorted(refused))
        result.deferred_request_ids = sorted(deferred)
        result.removed_block_ids = sorted(
            {b for rid in refused for b, h in self._claimed(out, rid) if self.declared.get(b) != h}
        )
        for block in result.removed_block_ids:
            self._unrecord(block)  # reported: no later claim of it is legitimate
        for rid in failed:
            self._forget(rid)
        self.voided |= failed
        self._sample(out, result, failed | set(withhold))
        self._drop(drop_blocks, result)
        return result

    def _place(self, rid: str, tokens: list[int], blocks: list[int], computed: int) -> None:
        assert rid not in self.tables, f"new {rid}, but the worker still holds it"
        self.tables[rid] = list(blocks)
        self.tokens[rid] = list(tokens)
        self.computed[rid] = computed
        self.committed[rid] = computed // self.block_size

    def _forget(self, rid: str) -> None:
        self.tables.pop(rid, None)
        self.tokens.pop(rid, None)
        self.computed.pop(rid, None)
        self.committed.pop(rid, None)

    def _refused_claims(
        self, out: SchedulerOutput, errored: dict[str, str], excused: frozenset[BlockHashPair]
    ) -> set[str]:
        """Provenance check, with same-step writes visible (writes precede reads per layer)."""
        refused: set[str] = set()
        while True:
            view = dict(self.declared)
            for item in chain(out.new, out.cont):
                if item.request_id not in refused and item.request_id not in errored:
                    view.update(item.written)
            newly = {
                new.request_id
                for new in out.new
                if new.request_id not in refused and any(view.get(b) != h for b, h in new.claimed)
            }
            if not newly:
                break
            refused |= newly
        self._check_refusals(out, view, written_by(out, refused | set(errored)) | excused)
        return refused

    def _check_refusals(
        self, out: SchedulerOutput, view: dict[int, bytes], unwritten: set[BlockHashPair]
    ) -> None:
        """A claim the worker cannot vouch for is a stale claim unless the test caused it: a
        record it overwrote, or a block a request failing in this very step was to write."""
        for new in out.new:
            for block, block_hash in new.claimed:
                if view.get(block) == block_hash or (block, block_hash) in unwritten:
                    continue
                tampered = self.declared.get(block) != self.recorded.get(block)
                assert tampered and self.recorded.get(block) == block_hash, (
                    f"{new.request_id} claims block {block} as {_short(block_hash)}, but the "
                    f"worker's record is {_short(view.get(block))} and no fault of the test "
                    "explains it: the scheduler handed out a stale claim (a block whose write "
                    "failed in an earlier step, or one it should have known was removed)"
                )

    @staticmethod
    def _claimed(out: SchedulerOutput, rid: str) -> list[tuple[int, bytes]]:
        return [pair for new in out.new if new.request_id == rid for pair in new.claimed]

    def _write(
        self,
        rid: str,
        num_new: int,
        written: list[tuple[int, bytes]],
        shared_now: set[int],
        drafts: list[int],
    ) -> None:
        """Drafted tokens are written as they are: a block a rejected draft reached holds the
        draft, and any claim or cached hash that names it as the request's text fails."""
        size, table, tokens = self.block_size, self.tables[rid], self.tokens[rid] + drafts
        start, end = self.computed[rid], self.computed[rid] + num_new
        assert end <= len(tokens), f"{rid}: scheduled past its known tokens"
        if not self.kv:
            assert table == [] and written == []
            self.computed[rid] = end
            return
        assert len(table) == -(-end // size), f"{rid}: table of {len(table)} for {end} tokens"
        others = {b for other, t in self.tables.items() if other != rid for b in t} - shared_now
        salt = self.requests[rid].cache_salt
        full_now = []
        for index in range(start // size, -(-end // size)):
            block = table[index]
            assert block not in others, f"{rid} writes block {block}, shared with another table"
            block_end = (index + 1) * size
            if block_end <= end:
                self.truth[block] = (salt, tuple(tokens[:block_end]))
                if start < block_end <= end - len(drafts):  # full of known tokens
                    full_now.append(block)
            else:
                self.truth[block] = None  # partial: holds nothing claimable
            self._unrecord(block)
        if written:
            # this step's full blocks, or (async scheduling) earlier full ones declared late,
            # once their token was known: always the next ones in table order, all written
            first = self.committed[rid]
            expected = table[first : first + len(written)]
            assert [b for b, _ in written] == expected, f"{rid}: written {written} != {expected}"
            assert first + len(written) <= end // size, f"{rid}: declares an unwritten block"
            assert self.late or [b for b, _ in written] == full_now, (
                f"{rid}: written {written} != {full_now}"
            )
            self.committed[rid] = first + len(written)
            self.declared.update(written)
            self.recorded.update(written)
        self.computed[rid] = end

    def _unrecord(self, block: int) -> None:
        self.declared.pop(block, None)
        self.recorded.pop(block, None)

    def _check_claims(
        self, rid: str, claimed: list[BlockHashPair], unwritten: set[BlockHashPair]
    ) -> None:
        """Every claim, refused ones too, must name the request's own prefix, except a block
        whose write failed in this step (it still holds what it held before)."""
        size, tokens = self.block_size, self.tokens[rid]
        salt = self.requests[rid].cache_salt
        for index, pair in enumerate(claimed):
            if pair in unwritten:
                continue
            block = pair[0]
            expected = (salt, tuple(tokens[: (index + 1) * size]))
            assert self.truth.get(block) == expected, (
                f"{rid} claims block {block} at position {index}, which holds "
                f"{self.truth.get(block)}, not {expected}: a stale cache entry"
            )
            self.claims_checked += 1

    def check_cache(self, cached: Iterable[BlockHashPair]) -> None:
        """Between steps every cached hash must name what its block really holds."""
        for block, block_hash in cached:
            truth = self.truth.get(block)
            assert truth is not None and self._hash(truth) == block_hash, (
                f"the scheduler caches block {block} as {_short(block_hash)}, but it holds "
                f"{truth}: a write that never happened, or a removal the scheduler missed"
            )

    def _hash(self, truth: Truth) -> bytes:
        if truth not in self._hashes:
            salt, tokens = truth
            num_blocks = len(tokens) // self.block_size
            keys = request_extra_keys(salt)
            self._hashes[truth] = extend_chain([], tokens, self.block_size, num_blocks, keys)[-1]
        return self._hashes[truth]

    def _sample(self, out: SchedulerOutput, result: ModelResult, skip: set[str]) -> None:
        for item in chain(out.new, out.cont):
            rid = item.request_id
            if rid in skip or rid not in self.tokens:
                continue
            if self.computed[rid] < len(self.tokens[rid]):
                continue  # a prompt chunk: nothing to sample yet
            if self.requests[rid].is_embedding:
                result.embedded.append(rid)
                continue
            drafts = getattr(item, "draft_token_ids", [])
            if drafts:
                self._verify(rid, item.num_computed_tokens, drafts, result)
                continue
            token = self.next_token(rid, self.tokens[rid])
            self.tokens[rid].append(token)
            result.sampled[rid] = token

    def _verify(self, rid: str, start: int, drafts: list[int], result: ModelResult) -> None:
        """Speculative decoding as a worker does it: the drafts that equal the tokens it
        would have sampled are kept, then its own token; positions past them stop counting
        and the blocks only they reached leave the table."""
        tokens = self.tokens[rid]
        kept = 0
        token = self.next_token(rid, tokens)
        while kept < len(drafts) and token == drafts[kept]:
            tokens.append(token)
            kept += 1
            token = self.next_token(rid, tokens)
        tokens.append(token)
        result.sampled[rid] = token
        if kept:
            result.accepted[rid] = kept
        self.computed[rid] = start + 1 + kept
        if self.kv:
            del self.tables[rid][-(-self.computed[rid] // self.block_size) :]

    def _drop(self, blocks: Iterable[int], result: ModelResult) -> None:
        held = {b for table in self.tables.values() for b in table}
        for block in blocks:
            if block in held:
                continue  # a worker only drops blocks no request of its own is using
            self._unrecord(block)
            self.truth.pop(block, None)
            result.removed_block_ids.append(block)

    def restart(self) -> None:
        self.voided.clear()
        self.committed.clear()
        self.tables.clear()
        self.tokens.clear()
        self.computed.clear()
        self.declared.clear()
        self.recorded.clear()
        self.truth.clear()


def _without(out: SchedulerOutput, voided: set[str]) -> SchedulerOutput:
    """The plan as the worker runs it: continuations of requests it voided are skipped."""
    if not voided:
        return out
    return replace(out, cont=[c for c in out.cont if c.request_id not in voided])


def written_by(out: SchedulerOutput, request_ids: set[str]) -> set[BlockHashPair]:
    items = chain(out.new, out.cont)
    return {pair for item in items if item.request_id in request_ids for pair in item.written}


def plan_ids(out: SchedulerOutput) -> set[str]:
    return {item.request_id for item in chain(out.new, out.cont)}


def _short(block_hash: bytes | None) -> str:
    return "nothing" if block_hash is None else block_hash.hex()[:12]
