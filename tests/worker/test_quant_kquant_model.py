"""A Llama served from a file that mixes types as llama-quantize's Q4_K_M does keeps every
matrix in its file's blocks (`--quantization gguf`) and computes what the same file dequantized
to float32 computes (`--quantization none`): logits within 1e-3, greedy tokens equal but at near
ties (the rule of tests/worker/test_quant_model.py).

The mix: Q4_K matrices; the tied embedding and head in Q6_K (as llama-quantize stores a tied
`token_embd` of a Q4_K_M file); layer 0's `attn_v` in Q6_K (a packed q/k/v of two types), layer
1's `ffn_up` in Q5_0 beside a Q4_K `ffn_gate`, its `ffn_down` in Q6_K and `attn_output` in Q5_K;
one Q5_1 and one Q8_0 matrix. The K-quants are random blocks with small finite scales
(tests/worker/gguf_files.py).
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from tests.worker.gguf_files import write_llama_gguf
from tests.worker.helpers import full_logits, greedy, make_runner, random_tokens
from tests.worker.quant_helpers import greedy_disagreements
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear, StackedQuantizedLinear

pytestmark = pytest.mark.timeout(900)
Q = GGMLQuantizationType
TOLERANCE = 1e-3
INT8_LOGIT_BOUND = 5e-2  # relative to the largest logit (tests/worker/test_quant_int8_model.py)
MIX = {
    "token_embd.weight": Q.Q6_K,
    "blk.0.attn_v.weight": Q.Q6_K,
    "blk.0.attn_output.weight": Q.Q5_1,
    "blk.0.ffn_down.weight": Q.Q8_0,
    "blk.1.ffn_up.weight": Q.Q5_0,
    "blk.1.ffn_down.weight": Q.Q6_K,
    "blk.1.attn_output.weight": Q.Q5_K,
}


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory, kv_cache_dir):  # noqa: ANN001, ANN201
    out = tmp_path_factory.mktemp("q4_k_m")
    return write_llama_gguf(out, Q.Q4_K, tied=True, seed=4, mix=MIX)


@pytest.fixture(scope="module")
def pair(gguf_path):  # noqa: ANN001, ANN201 - (quantized runner, float32 reference runner)
    quant = make_runner(gguf_path, quantization="gguf", fused_cpu_ops=False)
    return quant, make_runner(gguf_path, quantization="none", fused_cpu_ops=False)


def _types(model: torch.nn.Module) -> dict[str, int]:
    return {n: m.ggml_type for n, m in model.named_modules() if hasattr(m, "ggml_type")}


def test_every_matrix_keeps_its_files_type(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    types = _types(quant.model)
    embeds = [m for m in quant.model.modules() if isinstance(m, QuantizedEmbedding)]
    assert len(embeds) == 1 and embeds[0].ggml_type == Q.Q6_K
    head = quant.model.lm_head
    assert isinstance(head, QuantizedLinear) and head.ggml_type == Q.Q6_K
    assert head.blocks.data_ptr() == embeds[0].blocks.data_ptr()  # one copy serves both
    qkv0 = quant.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv0, StackedQuantizedLinear)
    assert [p.ggml_type for p in qkv0.parts] == [Q.Q4_K, Q.Q6_K]
    gate_up1 = quant.model.model.layers[1].mlp.gate_up_proj
    assert [p.ggml_type for p in gate_up1.parts] == [Q.Q4_K, Q.Q5_0]
    assert Q.Q5_K in types.values() and Q.Q5_1 in types.values() and Q.Q8_0 in types.values()
    floats = {n for n, p in quant.model.named_parameters() if p.numel()}
    assert all(n.endswith("norm.weight") for n in floats), floats
    assert not _types(ref.model)


def test_the_weights_in_memory_are_the_files_bytes(pair, gguf_path) -> None:  # noqa: ANN001
    from worker.gguf import open_checkpoint

    quant, _ = pair
    quantized = sum(
        t.nbytes for t in open_checkpoint(gguf_path).tensors() if int(t.ggml_type) != Q.F32
    )
    held = {
        m.blocks.data_ptr(): m.blocks.nbytes for m in quant.model.modules() if hasattr(m, "blocks")
    }
    assert sum(held.values()) == quantized


def test_logits_within_tolerance_of_the_dequantized_model(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    for seed, length in ((0, 1), (1, 9), (2, 40)):
        tokens = random_tokens(length, quant.vocab_size, seed)
        got, want = full_logits(quant, tokens), full_logits(ref, tokens)
        assert (got - want).abs().max().item() <= TOLERANCE


def test_greedy_tokens_equal_except_near_ties(pair) -> None:  # noqa: ANN001
    quant, ref = pair
    prompt = random_tokens(10, quant.vocab_size, 6)
    sequence = prompt + greedy(ref, prompt, 16)
    want = full_logits(ref, sequence)[len(prompt) - 1 : -1]
    got = full_logits(quant, sequence)[len(prompt) - 1 : -1]
    assert greedy_disagreements(want, got, TOLERANCE) == []


def test_int8_activations_stay_within_their_bound(pair, gguf_path) -> None:  # noqa: ANN001
    """`--quantization gguf-int8` on the mixed file: the K-quant, Q4/Q8 layers quantize their
    activations (Q5_0/Q5_1 stay float), logits within the int8 path's stated bound
    (tests/worker/test_quant_int8_model.py) relative to the largest."""
    _, ref = pair
    int8 = make_runner(gguf_path, quantization="gguf-int8", fused_cpu_ops=False)
    kinds = {
        m.ggml_type: m.activations for m in int8.model.modules() if isinstance(m, QuantizedLinear)
    }
    assert kinds[Q.Q4_K] == kinds[Q.Q6_K] == kinds[Q.Q5_K] == kinds[Q.Q8_0] == "int8"
    assert kinds[Q.Q5_0] == kinds[Q.Q5_1] == "float"
    for seed, length in ((0, 1), (1, 9)):
        tokens = random_tokens(length, int8.vocab_size, seed)
        got, want = full_logits(int8, tokens), full_logits(ref, tokens)
        assert (got - want).abs().max().item() <= INT8_LOGIT_BOUND * want.abs().max().item()
