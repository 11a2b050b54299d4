"""Constrained decoding in the worker: a grammar matcher per structured request, and the token
masks the sampler applies before it draws (kvledger/structured.py says what a spec means).

Rules, and why:
- A matcher's state is a function of the request's output tokens, nothing else: before each
  mask it catches up on the outputs it has not seen (`Constraint.sync`). A request that comes
  back after preemption, recomputation, a lost worker or a resumed stream arrives with its
  outputs so far, and gets a fresh matcher that replays them; nothing is carried by the plan.
- Grammars compile once per spec per worker (an LRU of compiled matchers, copied per request),
  under the settings' bounds (kvledger/groups.py: GrammarLimits; the depth is checked before
  the engine runs), on a compile thread of their own with a large stack. A request's compile
  starts when its plan arrives and is waited for only by its first mask, which is computed on
  the mask thread beside the forward pass: the compile overlaps the step's forward.
  The engine's tokenizer is built when the worker starts, on a thread of its own
  (`Grammars.prepare`; for a GGUF model, from the vocabulary its checkpoint kept from the one
  parse of the file, which takes seconds): the first structured request waits only for what
  is left of the build, if anything, never for a build of its own.
- Masks are computed for the constrained rows only, in one call over all of them (llguidance
  runs it on its own threads, without the GIL), and started before the forward pass, on a
  side thread, so that the batch's forward and the masks overlap (`Grammars.start`).
- A finished grammar allows only EOS: the request ends there (a bundled step past the end
  samples EOS again, which the scheduler never delivers).
- A spec that fails here fails its request alone, with the engine's message; the worker keeps
  serving (the frontend has already refused what it could).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import llguidance
import torch

from kvledger.grammar_tokenizer import build_grammar_tokenizer
from kvledger.groups import GrammarLimits
from kvledger.structured import (
    CONSTRAINT_FAILED,
    StructuredError,
    StructuredSpec,
    compile_matcher,
    engine_message,
)

log = logging.getLogger(__name__)

# Compiled grammars kept per worker; a request copies one (a copy costs about a microsecond).
MAX_COMPILED = 64
# The compile thread's stack: the margin past --max-structured-depth (the engine's compiler
# recurses on a spec's depth, a few KB a level).
COMPILE_STACK_BYTES = 256 << 20
COMPILE_NICENESS = 10


@dataclass
class Constraint:
    """One request's matcher (a copy of its spec's compiled template, once the compile is
    done), and how many of its output tokens it has consumed."""

    template: Future[llguidance.LLMatcher]
    eos_token_ids: frozenset[int]
    consumed: int = 0
    error: str | None = None
    _matcher: llguidance.LLMatcher | None = None

    @property
    def matcher(self) -> llguidance.LLMatcher:
        """The request's own matcher, waiting for its spec's compile if it is still running;
        StructuredError when the spec did not compile."""
        if self._matcher is None:
            self._matcher = self.template.result().deep_copy()
        return self._matcher

    def ready(self) -> bool:
        """Whether the matcher can be had without waiting for a compile."""
        return self._matcher is not None or self.template.done()

    def sync(self, outputs: Sequence[int]) -> None:
        """Consume the outputs not seen yet. After the grammar ended, only EOS may follow
        (sampled again by a bundled step that ran past the end, or under min_tokens)."""
        if self._matcher is None and self.error is None:
            try:
                self.matcher  # noqa: B018 - the compile's outcome, waited for here
            except Exception as err:  # noqa: BLE001 - StructuredError, or the engine's own:
                self.error = f"{CONSTRAINT_FAILED}{err}"  # either fails this request alone
        for token in outputs[self.consumed :]:
            if self.error is not None:
                return
            if self.matcher.is_stopped() and token in self.eos_token_ids:
                pass
            elif not self.matcher.consume_token(token):
                self.error = CONSTRAINT_FAILED + (
                    engine_message(self.matcher.get_error()) or f"token {token} breaks the grammar"
                )
            self.consumed += 1
        if len(outputs) < self.consumed:  # outputs never shrink; refuse to guess if they do
            self.error = CONSTRAINT_FAILED + "the request's outputs went back"


@dataclass
class Masks:
    """The allowed tokens of the constrained rows of one sampling batch."""

    rows: list[int]  # rows of the batch, in the order of `bitmask`
    bitmask: torch.Tensor  # [len(rows), ceil(V / 32)] int32, bit t % 32 of word t // 32
    errors: dict[int, str] = field(default_factory=dict)  # batch row -> why it fails


class Grammars:
    """One worker's compiled grammars and matchers, for its model's tokenizer."""

    def __init__(
        self,
        tokenizer_source: str,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        gguf_metadata: dict[str, Any] | None = None,
        limits: GrammarLimits | None = None,
    ) -> None:
        self.source = tokenizer_source
        self.limits = limits or GrammarLimits()
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        # the metadata of the GGUF file at `source`, vocabulary included, as the worker parsed
        # it for the weights: the file is not parsed again
        self._gguf_metadata = gguf_metadata
        self._tokenizer: Future[llguidance.LLTokenizer | StructuredError] | None = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[StructuredSpec, Future[llguidance.LLMatcher]] = OrderedDict()
        self._engine: llguidance.LLExecutor | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._compiler: ThreadPoolExecutor | None = None

    def prepare(self) -> Future[llguidance.LLTokenizer | StructuredError]:
        """Starts building the engine's tokenizer (once) on a daemon thread; its outcome, or
        the refusal every structured request on this model gets, is logged when it is known."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = Future()
                threading.Thread(target=self._build, name="grammar-tokenizer", daemon=True).start()
            return self._tokenizer

    def _build(self) -> None:
        assert self._tokenizer is not None
        started = time.monotonic()
        try:
            built = build_grammar_tokenizer(
                self.source, self.vocab_size, self.eos_token_ids, self._gguf_metadata
            )
        except Exception as err:  # noqa: BLE001 - an unset result would hang every request
            built = StructuredError(f"structured outputs: the grammar tokenizer failed: {err}")
        self._gguf_metadata = None  # read once: the worker's checkpoint cache owns it
        if isinstance(built, StructuredError):
            log.info("structured outputs are refused on this model: %s", built)
        else:
            log.info(
                "structured outputs: grammar tokenizer of %s ready (%d tokens, %.1f s)",
                self.source,
                self.vocab_size,
                time.monotonic() - started,
            )
        self._tokenizer.set_result(built)

    def tokenizer(self) -> llguidance.LLTokenizer:
        """The engine's tokenizer, once built (waiting for the rest of a build under way);
        StructuredError when this model's tokenizer cannot be constrained."""
        built = self.prepare().result()
        if isinstance(built, StructuredError):
            raise built
        return built

    def constraint(self, spec: StructuredSpec) -> Constraint:
        """A fresh matcher for `spec`, whose compile (if not done already) starts now on the
        compile thread; StructuredError when this model's tokenizer cannot be constrained. A
        spec that does not compile fails its request at its first mask."""
        tokenizer = self.tokenizer()
        template = self._compiled.get(spec)
        if template is None:
            template = self._compile_thread().submit(compile_matcher, spec, tokenizer, self.limits)
            self._compiled[spec] = template
            if len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(spec)
        # the model's EOS ids, or what the engine took for EOS when the model names none
        return Constraint(template, frozenset(tokenizer.eos_tokens))

    def _compile_thread(self) -> ThreadPoolExecutor:
        """One thread, started with COMPILE_STACK_BYTES of stack (threading's stack size is
        process-wide, so it is set only while that thread starts)."""
        if self._compiler is None:
            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                self._compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
                self._compiler.submit(_lower_priority).result()  # the thread starts now
            finally:
                threading.stack_size(previous)
        return self._compiler

    def start(self, rows: list[tuple[int, Constraint, Sequence[int]]]) -> Future[Masks]:
        """Masks for (batch row, constraint, outputs so far), computed on the side thread."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._thread.submit(self.compute, rows)

    def compute(self, rows: list[tuple[int, Constraint, Sequence[int]]]) -> Masks:
        words = (self.vocab_size + 31) // 32
        masks = Masks([row for row, _, _ in rows], torch.zeros(len(rows), words, dtype=torch.int32))
        live = []
        for i, (_, constraint, outputs) in enumerate(rows):
            constraint.sync(outputs)
            if constraint.error is None:
                live.append((constraint.matcher, i))
        if live:
            if self._engine is None:
                self._engine = llguidance.LLExecutor()
            bitmask = masks.bitmask
            self._engine.unsafe_compute_mask_ptr(live, bitmask.data_ptr(), words * 4, len(rows))
        for row, constraint, _ in rows:
            if constraint.error is None and constraint.matcher.is_error():
                constraint.error = CONSTRAINT_FAILED + engine_message(
                    constraint.matcher.get_error()
                )
            if constraint.error is not None:
                masks.errors[row] = constraint.error
        return masks


def _lower_priority() -> None:
    """The calling thread yields the cores to the step's threads (Linux: per-thread nice), so
    that a long compile slows no stream."""
    try:
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + COMPILE_NICENESS
        )
    except (OSError, AttributeError):  # not Linux: the compile runs at the worker's priority
        pass


# The bits of each byte value, lowest first: a bitmask's bytes index it (little-endian, the
# order the engine writes), eight tokens at a time; and the same as what masking adds to a
# logit (0 where allowed, -inf where not).
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()
_BYTE_BIAS = torch.zeros(256, 8).masked_fill(~_BYTE_BITS, float("-inf"))


def _unpack(bitmask: torch.Tensor, table: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, W] int32 -> [n, vocab_size] of `table`'s rows, one lookup per byte of the mask
    rather than a shift per bit (no per-token Python)."""
    as_bytes = bitmask.contiguous().view(torch.uint8).long()
    bits = torch.nn.functional.embedding(as_bytes, table.to(bitmask.device))
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size]


def allowed(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, W] int32 bitmask -> [n, vocab_size] bool: which tokens each row allows."""
    return _unpack(bitmask, _BYTE_BITS, vocab_size)


def apply_masks(
    logits: torch.Tensor, masks: Masks, native: ModuleType | None = None
) -> torch.Tensor:
    """`logits` with every token a row's grammar forbids at -inf (rows without a grammar
    untouched), written in place. A row left with nothing (min_tokens masked the EOS the
    grammar requires) draws among the grammar's tokens alone: the grammar wins, so the output
    stays valid. `native`: the compiled CPU kernels (worker/native.py), which read the packed
    mask as it is (microseconds a row); without them (no compiler, a GPU), the mask becomes a
    0/-inf bias added in place (torch's masked_fill with a bool mask cost several times more)."""
    if not masks.rows:
        return logits
    rows = torch.tensor(masks.rows, device=logits.device)
    if (
        native is not None
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.is_contiguous()
    ):
        native.mask_logits(logits, rows, masks.bitmask, False)
        return logits
    bias = _unpack(masks.bitmask.to(logits.device), _BYTE_BIAS, logits.shape[1])
    logits.index_add_(0, rows, bias.to(logits.dtype))
    dead = logits.amax(dim=-1)[rows] == float("-inf")
    if bool(dead.any()):
        logits[rows[dead]] = bias[dead].to(logits.dtype)  # 0 where allowed, -inf elsewhere
    return logits
