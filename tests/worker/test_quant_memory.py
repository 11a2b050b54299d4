"""What a worker holds after loading a quantized GGUF file: the blocks, the norms and the rotary
tables, and nothing of the file itself.

The memory rule (docs/performance.md, "Memory") leaves room for the blocks and the runtime, not
for a float copy of a weight or for the file staying mapped; these tests hold the parts that
can be counted exactly, where a resident-set threshold would be flaky.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from tests.worker.helpers import make_runner
from worker.gguf import open_checkpoint
from worker.gguf.checkpoint import _open_cached
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear

# the first test to load a runner builds the kernels (minutes on a loaded 2-core machine)
pytestmark = pytest.mark.timeout(900)


def mapped(path: Path) -> bool:
    """Whether this process maps the file (its pages may then count in the resident set)."""
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("activations", ["gguf", "gguf-int8"])
def test_loaded_model_keeps_no_float_weight_and_no_mapping(gguf_file, activations) -> None:  # noqa: ANN001
    runner = make_runner(gguf_file, quantization=activations, fused_cpu_ops=False)
    cfg = runner.config
    gc.collect()
    assert not mapped(gguf_file), "the loader kept the GGUF file mapped"
    model = runner.model
    assert any(isinstance(m, QuantizedEmbedding) for m in model.modules())
    # Every float tensor left is a norm weight (hidden), a bias, or a rotary table: none holds
    # a matrix's worth (hidden x hidden) of values, as a dequantized weight would.
    matrix = cfg.hidden_size * cfg.hidden_size
    for module_name, module in model.named_modules():
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, t in tensors:
            if t is None or not t.is_floating_point():
                continue
            where = f"{module_name}.{name} {tuple(t.shape)} in {type(module).__name__}"
            if "Rotary" in type(module).__name__:
                assert t.numel() <= runner.max_model_len * cfg.head_dim, where
            else:
                assert t.dim() == 1 and t.numel() < matrix, where
    blocks = {
        m.blocks.untyped_storage().data_ptr()
        for m in model.modules()
        if isinstance(m, QuantizedLinear | QuantizedEmbedding)
    }
    linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    # one buffer per layer; a tied LM head reads the embedding's
    assert len(blocks) == len(linears) + 1 - bool(cfg.tie_word_embeddings)


def test_checkpoint_unmaps_the_file_once_dropped(gguf_file) -> None:  # noqa: ANN001
    checkpoint = open_checkpoint(gguf_file)
    tensor = next(iter(checkpoint.tensors()))
    name, first = tensor.name, tensor.blocks().copy()
    assert mapped(gguf_file)
    del checkpoint
    gc.collect()
    assert mapped(gguf_file), "a tensor still alive keeps its view of the file"
    del tensor
    gc.collect()
    assert not mapped(gguf_file)
    # the parsed header stays cached: opening again maps the file without parsing it
    parsed = _open_cached.cache_info().misses
    again = next(iter(open_checkpoint(gguf_file).tensors()))
    assert _open_cached.cache_info().misses == parsed
    assert again.name == name and np.array_equal(again.blocks(), first)
