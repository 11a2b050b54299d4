"""The compiled CPU kernels built into an image (deploy/Dockerfile.cpu): a module under
KVLEDGER_PREBUILT_KERNELS with this source, torch and CPU digest is imported as is, with no
compiler and no torch builder; a directory without one leaves the normal build to run; a build
that fails is a reason, not an exception."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from worker import native


def test_the_prebuilt_module_of_this_digest_is_imported_without_a_build(tmp_path):
    built = native.load().require("the tests")  # the test machines build it
    name = native.build_name()
    (tmp_path / name).mkdir()
    shutil.copy(built.__file__, tmp_path / name / f"{name}.so")
    # A fresh process: this one already holds an extension module of that name.
    probe = (
        "import torch.utils.cpp_extension as ext; from worker import native\n"
        "def refuse(**_): raise RuntimeError('built instead of imported')\n"
        "ext.load = refuse\n"
        "b = native.load(); m = b.module; print(m.__file__ if m else b.reason, m.paged_decode)"
    )
    env = dict(os.environ, KVLEDGER_PREBUILT_KERNELS=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == str(tmp_path / name / f"{name}.so"), out.stdout


def test_a_module_of_another_digest_is_never_loaded(tmp_path, monkeypatch):
    stale = tmp_path / "kvledger_cpu_ops_000000000000"
    stale.mkdir()
    (stale / f"{stale.name}.so").write_bytes(b"not a module")
    monkeypatch.setenv("KVLEDGER_PREBUILT_KERNELS", str(tmp_path))
    assert native._prebuilt(native.build_name()) is None


def test_without_the_variable_nothing_is_looked_up(monkeypatch):
    monkeypatch.delenv("KVLEDGER_PREBUILT_KERNELS", raising=False)
    assert native._prebuilt(native.build_name()) is None


def test_the_digest_names_the_compiler_flags():
    """A build of other flags is another module: found by name under KVLEDGER_PREBUILT_KERNELS
    (no builder asked), the old build must not pass for the new one."""
    from worker.quant import kernels

    assert native.build_name() == native.build_name(native.FLAGS)
    assert native.build_name((*native.FLAGS, "-fno-tree-vectorize")) != native.build_name()
    assert kernels.build_name((*kernels.FLAGS, "-g")) != kernels.build_name()


def test_a_failed_build_says_why_and_require_names_who_needed_it(tmp_path, monkeypatch):
    """A build that fails is a result with its reason (the callers fall back to torch on it),
    never an exception out of load; `require` raises it for a caller that has no fallback."""
    monkeypatch.setenv("KVLEDGER_CACHE_DIR", str(tmp_path))
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    built = native.build_extension("kvledger_broken_000000000000", [source], ["-O0"])
    assert not built.ok and built.module is None
    assert built.reason.startswith("the compiled CPU kernels did not build: ")
    with pytest.raises(RuntimeError, match="quantized weights need the compiled kernels: the"):
        built.require("quantized weights")
