"""Fixtures for the worker tests: small random checkpoints saved by transformers itself.

Nothing here downloads: the tests run with HF_HUB_OFFLINE=1 and every model is either written
by transformers from a config in this file or generated (tiny-llama) into a temporary cache.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.worker.byte_tokenizer import write_byte_tokenizer  # noqa: E402
from tests.worker.helpers import save_hf_checkpoint  # noqa: E402
from tests.worker.quant_helpers import TYPES  # noqa: E402
from tools.gguf_export import export  # noqa: E402

PREBUILT = "KVLEDGER_PREBUILT_KERNELS"


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_hf_checkpoint(tmp_path_factory.mktemp(name), name)
        return made[name]

    return get


@pytest.fixture(scope="session")
def kv_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private KVLEDGER_CACHE_DIR so tests never write to (or depend on) the user's cache.

    One thing is read from it: compiled kernels already built there (`make kernels`) are
    loaded as an image's prebuilt ones are (KVLEDGER_PREBUILT_KERNELS, worker/native.py),
    only under their exact source, torch and CPU digest. Without that, every process that
    starts after this fixture (spawned ranks, workers) rebuilds them into the private cache:
    minutes on two cores, long enough to run past a test's timeout."""
    from kvledger.models import cache_dir

    built = cache_dir() / "torch_extensions"
    path = tmp_path_factory.mktemp("kvledger-cache")
    saved = {name: os.environ.get(name) for name in ("KVLEDGER_CACHE_DIR", PREBUILT)}
    os.environ["KVLEDGER_CACHE_DIR"] = str(path)
    if saved[PREBUILT] is None and built.is_dir():
        os.environ[PREBUILT] = str(built)
    yield path
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_llama_dir(kv_cache_dir: Path) -> Path:
    from kvledger.models import resolve_model

    return resolve_model("tiny-llama")


@pytest.fixture(scope="module", params=[t.name for t in TYPES])
def gguf_file(
    request: pytest.FixtureRequest,
    hf_checkpoint: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
    kv_cache_dir: Path,
) -> Path:
    """A random Llama written as a GGUF file with its linear weights and embedding in one
    quantized type (each type in turn), for the quantized-weight model tests."""
    out = tmp_path_factory.mktemp(f"gguf-{request.param}") / f"llama.{request.param}.gguf"
    export(hf_checkpoint("llama"), out, request.param)
    return out


@pytest.fixture
def f32_tiles_kernel(kv_cache_dir: Path) -> None:
    """Skips the test where kvledger's float32 tile kernel cannot run (no AVX-512, or the
    quantized kernels do not build); the kernels build into the test cache, not the user's."""
    from worker.layers import linear

    if not linear.tiles_run():
        pytest.skip("the float32 tiles' kernel needs AVX-512 and the quantized kernels' build")


@pytest.fixture(scope="module")
def byte_tokenizer_dir(tmp_path_factory) -> Path:
    """A small byte-level BPE tokenizer (tests/worker/byte_tokenizer.py) for grammar tests."""
    return write_byte_tokenizer(tmp_path_factory.mktemp("byte-tokenizer"))
