"""The int8 screen of a Q8_0 LM head (`worker/layers/int8_screen.py`): its bound holds for
every logit, its token is the exact head's first largest logit for random, tied and nearly
tied logits, it hands back to the full logits what it cannot bound, and SmolLM2 on the exact
path decodes the same tokens with and without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from kvledger.gguf_tokenizer import load_gguf_tokenizer
from kvledger.models import smollm2_path
from tests.worker.quant_helpers import int8_activations, quantized
from worker.layers.int8_screen import Int8ScreenedArgmax
from worker.quant import kernels
from worker.quant.layers import QuantizedLinear
from worker.runner.batch import SeqChunk

from .helpers import make_runner

Q8_0 = GGMLQuantizationType.Q8_0


@pytest.fixture
def screens(kv_cache_dir) -> None:  # noqa: ANN001 - the private cache the build goes to
    built = kernels.load().module
    if built is None or not built.q8_vnni_runs():
        pytest.skip("the int8 screen needs AVX-512 VNNI with VBMI")


def head_of(w: np.ndarray, activations: str = "float") -> QuantizedLinear:
    blocks = torch.from_numpy(quantize(w.astype(np.float32), Q8_0).copy())
    layer = QuantizedLinear(w.shape[1], blocks, int(Q8_0), activations=activations)
    assert layer.rows16
    return layer


def screen_of(head: QuantizedLinear, vocab: int | None = None) -> Int8ScreenedArgmax:
    screen = Int8ScreenedArgmax.for_head(head, vocab or head.out_features)
    assert screen is not None
    return screen


def full_argmax(head: QuantizedLinear, x: torch.Tensor, vocab: int) -> list[int]:
    """What the runner's full path picks: the exact head's logits, their first largest."""
    return head(x)[:, :vocab].argmax(dim=1).tolist()


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_every_logit_lies_within_the_bound(screens: None, scale: float) -> None:
    head = head_of(np.random.default_rng(0).standard_normal((512, 96)) * 0.05)
    screen = screen_of(head)
    for rows in (4, 16, 33):
        x = int8_activations(rows, 96, rows) * scale  # a zero block and an outlier
        approx = kernels.require().linear_int8_rows16(x, head.blocks, int(Q8_0), 96)
        err = (screen.row_bounds(x)[:, None] * screen.norms[None, :].double()).float()
        assert ((approx - head(x)).abs() <= err).all(), rows
        # the bound is not vacuous: the int8 logits do differ, and the margin is modest
        assert (approx != head(x)).any() and float(err.max()) < 0.1 * float(head(x).abs().max())


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_rows_pick_the_exact_heads_token(screens: None, scale: float) -> None:
    """Rows as a model's last hidden states are: near one token's weight row, with noise (on
    rows of pure noise most logits lie within the bound of the largest, and the screen hands
    them back)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 4096 - 9  # a last group of 7 rows: its padding is never a token
    w = np.random.default_rng(1).standard_normal((4096, 64)) * 0.1
    head = head_of(w)
    screen = screen_of(head, vocab)
    rows_of_w = torch.from_numpy(w.astype(np.float32))
    for rows in (4, 5, 16, 40):
        near = rows_of_w[torch.randint(0, vocab, (rows,), generator=gen)]
        x = (near * 10 + torch.randn(rows, 64, generator=gen)) * scale
        assert screen(x) == full_argmax(head, x, vocab)
    assert screen.screened_rows == 65


def test_exact_ties_take_the_first_index(screens: None) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((512, 64)) * 0.05
    w[40] = w[300] = w[301] = rng.standard_normal(64)  # three equal rows, two groups
    head = head_of(w)
    x = torch.from_numpy(w[40].astype(np.float32)).repeat(4, 1)
    assert full_argmax(head, x, 512) == [40] * 4
    assert screen_of(head)(x) == [40] * 4


def test_near_ties_are_decided_by_the_exact_sums(screens: None) -> None:
    """Two logits closer than the int8 screen can tell apart: the exact path's sums decide,
    whichever way the two rows lean. The rows are whole Q8_0 steps (each block's largest value
    127 steps), so the file holds them exactly and they differ by one step in one value."""
    rng = np.random.default_rng(3)
    step = 0.01
    base = rng.integers(-100, 100, 64) * step
    base[0] = base[32] = 127 * step  # each block's scale is `step`
    for lean in (1, -1):
        w = rng.standard_normal((256, 64)) * 0.05
        w[17], w[200] = base, base.copy()
        w[200][5] += lean * step  # logits 17 and 200 differ by step * x[5] = 0.03
        head = head_of(w)
        x = torch.from_numpy(base.astype(np.float32)).repeat(4, 1)
        x[:, 5] = 3.0
        want = full_argmax(head, x, 256)
        assert want == [200 if lean > 0 else 17] * 4
        assert screen_of(head)(x) == want


def test_what_it_cannot_bound_goes_to_the_full_logits(screens: None) -> None:
    w = np.random.default_rng(4).standard_normal((512, 64)) * 0.05
    head = head_of(w)
    screen = screen_of(head)
    x = torch.from_numpy(w[:8].astype(np.float32)) * 20  # each row near one token's
    assert screen(x[:3]) is None  # below MIN_ROWS: the exact head costs no more
    bad = x.clone()
    bad[2, 7] = float("nan")
    assert screen(bad) is None
    bad[2, 7] = float("inf")
    assert screen(bad) is None
    assert screen.screened_rows == 0
    assert screen(x) is not None and screen.screened_rows == 8  # the refusals left no state


def test_too_many_candidates_back_off(screens: None) -> None:
    """Flat logits (rows of zeros: every logit 0) make every group a candidate: the screen
    refuses, then stays off for 1, 2, 4 ... steps, and a step it decides resets it."""
    w = np.random.default_rng(6).standard_normal((512, 64)) * 0.1
    head = head_of(w)
    screen = screen_of(head)
    flat = torch.zeros(4, 64)
    skipped = []
    for _ in range(12):
        before = screen.refusals
        assert screen(flat) is None
        skipped.append(screen.refusals == before)
    # refusal, skip 1, refusal, skip 2, refusal, skip 4, refusal, ...
    assert skipped == [False, True, False, True, True, False, True, True, True, True, False, True]
    assert screen.refusals == 4 and screen.skip == 7
    screen.skip = 0
    near = torch.from_numpy(w[:4].astype(np.float32)) * 10
    assert screen(near) == full_argmax(head, near, 512) and screen.refusals == 0


def test_a_head_it_cannot_screen_gets_none(screens: None) -> None:
    w = np.random.default_rng(5).standard_normal((64, 64))
    assert Int8ScreenedArgmax.for_head(head_of(w, "int8"), 64) is None  # gguf-int8's own head
    q4, _ = quantized(64, 64, GGMLQuantizationType.Q4_0)
    assert Int8ScreenedArgmax.for_head(QuantizedLinear(64, q4, 2), 64) is None
    assert Int8ScreenedArgmax.for_head(torch.nn.Linear(64, 64), 64) is None


CHATS = [
    "Write a short poem about the sea.",
    "Explain how a hash map works.",
    "What is the capital of France?",
    "List three uses of Python.",
]


@torch.inference_mode()
def chat_tokens(runner, prompts: list[list[int]], steps: int) -> list[list[int]]:  # noqa: ANN001
    seqs = [list(p) for p in prompts]
    chunks = [
        SeqChunk(f"c{i}", seq, 0, list(range(8 * i, 8 * i + 8)), True) for i, seq in enumerate(seqs)
    ]
    for _ in range(steps):
        for seq, sample in zip(seqs, runner.execute(chunks), strict=True):
            seq.append(sample.token_id)
        chunks = [
            SeqChunk(c.request_id, seq[-1:], len(seq) - 1, c.block_table, True)
            for c, seq in zip(chunks, seqs, strict=True)
        ]
    return seqs


def test_smollm2_decodes_the_same_tokens_screened(screens: None) -> None:
    """The packaged SmolLM2 file (Q4_1 layers, a tied Q8_0 head) on the exact path: 16 chats'
    greedy tokens with the screen equal the full head's, and the screen decided most rows (a
    random model's flat logits would leave it too many candidates)."""
    path = smollm2_path()
    tokenizer = load_gguf_tokenizer(path).tokenizer
    template = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [tokenizer.encode(template.format(c)).ids for c in CHATS * 4]
    screened = make_runner(path, num_blocks=8 * 16 + 1, attention_backend="auto")
    full = make_runner(
        path, num_blocks=8 * 16 + 1, attention_backend="auto", screened_greedy_head=False
    )
    assert isinstance(screened.greedy_head, Int8ScreenedArgmax) and full.greedy_head is None
    assert chat_tokens(screened, prompts, 8) == chat_tokens(full, prompts, 8)
    assert screened.greedy_head.screened_rows >= 4 * 16
