"""Builds and loads the worker's compiled CPU kernels (`csrc/`) once per machine.

One module holds them all (`csrc/ops.h` lists them): the paged decode attention kernel
(`--attention-backend cpu`), the decoder's fused elementwise steps (`--fused-cpu-ops`), and the
sampler's argmax and grammar masks.
It is compiled with the local compiler by torch's extension builder into
`<KVLEDGER_CACHE_DIR>/torch_extensions/`, under a name that carries a digest of the sources,
the torch version and this CPU's instruction-set flags: it is built with `-march=native` (or
`KVLEDGER_CPU_MARCH`), so a
cache directory shared between machines (a volume) never hands one CPU another's binary. A
build takes ~1 min on two cores, once (`make install` runs it: worker/build_kernels.py); later
starts load it in milliseconds. No file but module.cpp includes pybind11 (csrc/aten_lite.h says
why). Where no
compiler or ninja is available the build fails, `load()` says why, and the callers fall back
to torch: the reference attention backend, the torch ops of `worker/layers/`.

An image with no compiler (deploy/Dockerfile.cpu) builds the module at image build time and
names the directory in `KVLEDGER_PREBUILT_KERNELS`: a module there under this source, torch and
CPU digest is imported as is, without torch's builder (which would want a compiler to check it).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / name for name in ("module.cpp", "paged_decode.cpp", "fused.cpp", "masks.cpp")]
HEADERS = [
    CSRC / name
    for name in (
        "aten_lite.h",
        "ops.h",
        "decode_block.h",
        "shared_prefix.h",
        "shared_prefix_kernels.h",
    )
]
_lock = threading.Lock()


@dataclass(frozen=True)
class Built:
    """A compiled extension, or the one-line reason there is none: a caller that can run
    without it falls back to torch on `reason`; one that cannot calls `require`."""

    module: ModuleType | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.module is not None

    def require(self, purpose: str) -> ModuleType:
        """The module, or a RuntimeError saying what needed it and why there is none."""
        if self.module is None:
            raise RuntimeError(f"{purpose} need the compiled kernels: {self.reason}")
        return self.module


_loaded: dict[str, Built] = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# `KVLEDGER_CPU_MARCH` names another target than this CPU (e.g. `haswell`: AVX2, FMA, F16C), so
# that an AVX-512 machine can measure the code an AVX2-only CPU runs; the build name carries it.
MARCH_ENV = "KVLEDGER_CPU_MARCH"
MARCH = os.environ.get(MARCH_ENV, "").strip() or "native"
# fast math lets GCC vectorize expf (glibc libmvec) and the dot products' sums
FLAGS = ("-O3", f"-march={MARCH}", "-ffast-math")


def build_name(flags: tuple[str, ...] = FLAGS) -> str:
    """A digest of the sources, their directory, the compiler flags, torch's version and the
    CPU's flags. The directory is in it because ninja's build file names the sources by path:
    two checkouts sharing one cache would otherwise rebuild the same module in turn. The
    compiler flags are, because a build found by name (KVLEDGER_PREBUILT_KERNELS) is imported
    without asking torch's builder, which would have rebuilt it for other flags."""
    digest = hashlib.sha256(str(SOURCES[0].parent).encode())
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    for part in (" ".join(flags).encode(), torch.__version__.encode(), _cpu_flags().encode()):
        digest.update(part)
    return f"kvledger_cpu_ops_{digest.hexdigest()[:12]}"


def _build_dir(name: str | None = None) -> Path:
    from kvledger.models import cache_dir

    path = cache_dir() / "torch_extensions" / (name or build_name())
    path.mkdir(parents=True, exist_ok=True)
    return path


def load() -> Built:
    """The compiled module, or the reason it could not be built (cached either way)."""
    with _lock:
        if "module" not in _loaded:
            _loaded["module"] = _build()
        return _loaded["module"]


def _prebuilt(name: str) -> ModuleType | None:
    """The module `name` (a digest name) built into the image, if there is one."""
    root = os.environ.get("KVLEDGER_PREBUILT_KERNELS")
    if not root:
        return None
    path = Path(root) / name / f"{name}.so"
    if not path.is_file():
        log.info("no prebuilt CPU kernels for this CPU and source in %s", root)
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build() -> Built:
    return build_extension(build_name(), SOURCES, list(FLAGS))


def build_extension(name: str, sources: list[Path], flags: list[str]) -> Built:
    """Builds (once, under a lock) and loads the extension `name` from `sources`, or says in
    one line why it could not be built. OpenMP is added where torch has it. A build of
    the same name found under KVLEDGER_PREBUILT_KERNELS (an image's) is loaded instead."""
    from torch.utils import cpp_extension

    prebuilt = _prebuilt(name)
    if prebuilt is not None:
        return Built(prebuilt)

    flags = list(flags)
    if torch.backends.openmp.is_available():
        flags.append("-fopenmp")  # at::parallel_for runs serially unless OpenMP is on here too
    log.info("loading the compiled CPU kernels %s (built once per machine: ~1 min)", name)
    try:
        build_dir = _build_dir(name)
        # torch's own build lock is a file that a builder killed mid-build (a worker stopped
        # during startup) leaves behind, and every later build would wait on it forever. An
        # flock dies with its holder: whoever holds it is the only builder, so any torch lock
        # file found then is stale.
        with open(build_dir / "kvledger.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (build_dir / "lock").unlink(missing_ok=True)
            module = cpp_extension.load(
                name=name,
                sources=[str(path) for path in sources],
                extra_cflags=flags,
                build_directory=str(build_dir),
                verbose=False,
            )
            return Built(module)
    except Exception as err:  # noqa: BLE001 - any build failure means: use torch instead
        reason = str(err).strip().splitlines()
        why = reason[-1] if reason else err
        return Built(None, f"the compiled CPU kernels did not build: {why}")
