"""A Llama served from a quantized GGUF file with its blocks kept in memory (`--quantization
gguf`, `worker/quant/`) computes what the same file dequantized to float32 computes
(`--quantization none`): logits within 1e-3, and greedy tokens equal except where the
reference's two best logits are closer than that (where either choice is within tolerance).

The files are written from a random checkpoint by `tools/gguf_export.py` with every
linear weight and the embedding quantized (Q8_0, Q4_0, Q4_1); the norms stay F32.
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.helpers import full_logits, greedy, make_runner, random_tokens
from tests.worker.quant_helpers import greedy_disagreements
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear
from worker.quant.select import check_quantization

# the first test to load a runner builds the kernels (minutes on a loaded 2-core machine)
pytestmark = pytest.mark.timeout(900)
TOLERANCE = 1e-3


def test_the_greedy_rule_allows_only_near_ties() -> None:
    ref = torch.tensor([[1.0, 0.9995, 0.0], [1.0, 0.5, 0.0], [0.0, 2.0, 1.0]])
    same = ref.clone()
    assert greedy_disagreements(ref, same, TOLERANCE) == []
    near_tie_flipped = ref.clone()
    near_tie_flipped[0, 1] = 1.0004  # row 0's best two are 5e-4 apart: either may win
    assert greedy_disagreements(ref, near_tie_flipped, TOLERANCE) == []
    clear_flipped = ref.clone()
    clear_flipped[1, 1] = 1.1  # row 1's margin is 0.5: a flip is a wrong token
    clear_flipped[2, 2] = 2.5
    assert greedy_disagreements(ref, clear_flipped, TOLERANCE) == [1, 2]


@pytest.fixture(scope="module")
def pair(gguf_file):  # noqa: ANN001, ANN201 - (quantized runner, float32 reference runner)
    # the fused elementwise kernels are another build, and beside the point here: both off
    quant = make_runner(gguf_file, quantization="gguf", fused_cpu_ops=False)
    return quant, make_runner(gguf_file, quantization="none", fused_cpu_ops=False)


def test_every_weight_but_the_norms_stays_in_blocks(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    assert quant.quantized and not ref.quantized
    layers = quant.config.num_layers
    linears = [m for m in quant.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(linears) == 4 * layers + 1  # qkv, o, gate_up, down per layer; the LM head
    embeds = [m for m in quant.model.modules() if isinstance(m, QuantizedEmbedding)]
    assert len(embeds) == 1
    floats = {n for n, p in quant.model.named_parameters() if p.numel()}
    assert all(n.endswith("norm.weight") for n in floats), floats
    assert not any(isinstance(m, QuantizedLinear) for m in ref.model.modules())


def test_logits_within_tolerance_of_the_dequantized_model(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    for seed, length in ((0, 1), (1, 7), (2, 40)):
        tokens = random_tokens(length, quant.vocab_size, seed)
        got, want = full_logits(quant, tokens), full_logits(ref, tokens)
        assert (got - want).abs().max().item() <= TOLERANCE


def test_greedy_tokens_equal_except_near_ties(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    prompt = random_tokens(12, quant.vocab_size, 5)
    ref_tokens = greedy(ref, prompt, 16)
    got_tokens = greedy(quant, prompt, 16)
    # both models scored on the reference's sequence, so each position sees the same context
    sequence = prompt + ref_tokens
    want = full_logits(ref, sequence)[len(prompt) - 1 : -1]
    got = full_logits(quant, sequence)[len(prompt) - 1 : -1]
    assert greedy_disagreements(want, got, TOLERANCE) == []
    first = next(
        (i for i, (a, b) in enumerate(zip(ref_tokens, got_tokens, strict=True)) if a != b), None
    )
    if first is not None:  # a free-running divergence may only start at a near tie
        top2 = want[first].topk(2).values
        assert (top2[0] - top2[1]).item() < TOLERANCE


def test_what_cannot_run_quantized_is_refused_or_dequantized(gguf_file, hf_checkpoint) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="needs a GGUF file"):
        check_quantization("gguf", hf_checkpoint("llama"), "cpu", 1)
    assert check_quantization("auto", hf_checkpoint("llama"), "cpu", 1) is False
    with pytest.raises(ValueError, match="tensor-parallel"):
        check_quantization("gguf", gguf_file, "cpu", 2)
    with pytest.raises(ValueError, match="CPU only"):
        check_quantization("gguf", gguf_file, "cuda", 1)
    assert check_quantization("auto", gguf_file, "cpu", 2) is False
    assert check_quantization("auto", gguf_file, "cpu", 1) is True
    with pytest.raises(ValueError, match="expected one of"):
        check_quantization("awq", gguf_file, "cpu", 1)
