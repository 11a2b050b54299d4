"""GGUF files (written here with gguf.GGUFWriter, one per supported type) load into the worker
as transformers loads them with `gguf_file=`: every dequantized tensor equals
gguf.quants.dequantize, logits agree within 1e-4 (float32), greedy decoding token for token.
An unsupported type, a truncated file (K-quants included), a block scale or a float weight that
is not finite, a hyperparameter that is not finite or in range, and a string past its bound stop
the worker with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from tests.worker.gguf_files import SHAPE, ggml_permute, write_llama_gguf
from tests.worker.helpers import ATOL, full_logits, greedy, hf_greedy, make_runner, random_tokens
from worker.gguf import SUPPORTED_TYPES, open_checkpoint
from worker.gguf.names import Permute, unpermute_order

REPO = Path(__file__).resolve().parents[2]
TYPES = [t.name for t in SUPPORTED_TYPES]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Path] = {}

    def get(type_name: str) -> Path:
        if type_name not in made:
            from gguf import GGMLQuantizationType

            out = tmp_path_factory.mktemp(type_name)
            # the F32 file ties its embeddings, the others keep an output.weight
            qtype = GGMLQuantizationType[type_name]
            made[type_name] = write_llama_gguf(out, qtype, tied=type_name == "F32")
        return made[type_name]

    return get


def hf_gguf_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(24 * 3, dtype=np.float32).reshape(24, 3)
    for heads in (1, 2, 3):
        permuted = ggml_permute(w, heads)
        np.testing.assert_array_equal(permuted[unpermute_order(24, Permute(heads))], w)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantized_tensors_equal_gguf_dequantize(gguf_file, type_name: str) -> None:
    path = gguf_file(type_name)
    reference = {t.name: t for t in GGUFReader(path).tensors}
    checkpoint = open_checkpoint(path)
    seen = 0
    for tensor in checkpoint.tensors():
        ref = reference[tensor.gguf_name]
        expected = dequantize(ref.data, ref.tensor_type).reshape(tensor.shape)
        if tensor.permute is not None:
            expected = expected[unpermute_order(tensor.shape[0], tensor.permute)]
        assert tensor.ggml_type == ref.tensor_type
        assert tensor.blocks().dtype == np.uint8
        expected_t = torch.from_numpy(np.array(expected, dtype=np.float32))
        torch.testing.assert_close(tensor.dequantize(), expected_t, atol=0, rtol=0)
        seen += 1
    assert seen == len(reference)


def test_f32_file_gives_back_the_original_weights(gguf_file) -> None:
    """Q/K order undone: the F32 file's tensors are the transformers model's, bit for bit."""
    from safetensors.torch import load_file

    path = gguf_file("F32")
    original = load_file(str(path.parent / "hf" / "model.safetensors"))
    for tensor in open_checkpoint(path).tensors():
        torch.testing.assert_close(tensor.dequantize(), original[tensor.name], atol=0, rtol=0)


@pytest.mark.parametrize("type_name", TYPES)
def test_logits_and_greedy_equal_transformers_gguf(gguf_file, type_name: str) -> None:
    path = gguf_file(type_name)
    hf = hf_gguf_model(path)
    tokens = random_tokens(24, SHAPE["vocab_size"], seed=5)
    runner = make_runner(path)
    with torch.no_grad():
        theirs = hf(torch.tensor([tokens])).logits[0].float()
    # rtol: float32's own (torch's default), for the largest logits of random weights
    torch.testing.assert_close(full_logits(runner, tokens), theirs, atol=ATOL, rtol=1.3e-6)
    prompt = tokens[:7]
    assert greedy(make_runner(path, block_size=8), prompt, 24) == hf_greedy(hf, prompt, 24)


def worker_startup(path: Path) -> subprocess.CompletedProcess:
    """`python -m worker --model PATH` until it refuses the model (no scheduler is needed)."""
    cmd = [sys.executable, "-m", "worker", "--model", str(path), "--scheduler", "127.0.0.1:9"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)


def assert_one_line_refusal(result: subprocess.CompletedProcess, *words: str) -> None:
    out = (result.stdout + result.stderr).strip()
    assert result.returncode != 0, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if "ERROR" in line]
    assert len(lines) == 1, out
    for word in words:
        assert word in lines[0], out


def test_unsupported_type_is_one_line(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType

    path = write_llama_gguf(
        tmp_path,
        GGMLQuantizationType.Q8_0,
        odd_one=("blk.1.ffn_up.weight", GGMLQuantizationType.Q2_K),
    )
    assert_one_line_refusal(worker_startup(path), "blk.1.ffn_up.weight", "Q2_K")


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K"])
def test_truncated_file_is_one_line(gguf_file, tmp_path: Path, type_name: str) -> None:
    whole = gguf_file(type_name).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 1000])
    assert_one_line_refusal(worker_startup(cut), "truncated", str(cut))


@pytest.mark.parametrize(
    ("type_name", "field", "value"),
    [
        ("Q4_K", 0, np.float16("nan")),  # a super-block's d
        ("Q4_K", 2, np.float16("inf")),  # its dmin
        ("Q6_K", 208, np.float16("-inf")),
        ("Q4_0", 0, np.float16("nan")),
        ("F32", 0, np.float32("nan")),  # a float weight itself
    ],
)
def test_a_scale_or_weight_that_is_not_finite_is_one_line(
    gguf_file, tmp_path: Path, type_name: str, field: int, value: np.generic
) -> None:
    """One NaN block scale makes every output NaN: the worker refuses the file, naming the
    tensor, whether the blocks are kept or dequantized."""
    whole = bytearray(gguf_file(type_name).read_bytes())
    tensor = next(
        t for t in GGUFReader(gguf_file(type_name)).tensors if t.name == "blk.1.ffn_up.weight"
    )
    step = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]  # the block's bytes (F32: 4)
    at = int(tensor.data_offset) + 3 * step + field  # the fourth block
    whole[at : at + value.nbytes] = value.tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(whole))
    assert_one_line_refusal(worker_startup(bad), "blk.1.ffn_up.weight", "not finite")


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({"rope_theta": float("nan")}, ("rope_theta", "nan")),
        ({"rope_theta": -1.0}, ("rope_theta", "out of range")),
        ({"rms_norm_eps": float("inf")}, ("rms_norm_eps",)),
        ({"num_hidden_layers": 0}, ("num_hidden_layers", "out of range")),
    ],
)
def test_a_hyperparameter_that_is_not_finite_or_in_range_is_one_line(
    tmp_path: Path, metadata: dict, words: tuple[str, ...]
) -> None:
    """A NaN RoPE base once served, every output garbage: each number is checked first."""
    from gguf import GGMLQuantizationType

    path = write_llama_gguf(tmp_path, GGMLQuantizationType.F32, metadata=metadata)
    assert_one_line_refusal(worker_startup(path), *words)


def test_a_huge_token_string_is_one_line_before_anything_decodes_it(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType

    path = write_llama_gguf(tmp_path, GGMLQuantizationType.F32, long_token=10_000)
    assert_one_line_refusal(worker_startup(path), "tokenizer.ggml.tokens", "10000 bytes")
