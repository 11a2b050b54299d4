"""kvledger's model modules are called straight into their `forward` (worker/layers/module.py):
`nn.Module.__call__`'s hook checks cost ~3 us a module, ~200 modules a decode step. A model
class that derives from `nn.Module` directly would quietly bring them back."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tests.worker.helpers import make_runner
from worker.layers.module import Module


def test_every_module_of_a_loaded_model_calls_its_forward(tiny_llama_dir: Path) -> None:
    runner = make_runner(tiny_llama_dir, num_blocks=8)
    containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    modules = [m for m in runner.model.modules() if not isinstance(m, containers)]
    assert len(modules) > 10
    for module in modules:
        assert isinstance(module, Module), type(module)
        assert type(module).__call__ is type(module).forward, type(module)


def test_a_subclass_calls_its_own_forward() -> None:
    class Base(Module):
        def forward(self, x: int) -> int:
            return x + 1

    class Child(Base):
        def forward(self, x: int) -> int:
            return 2 * x

    class Plain(Base):
        pass

    assert Base()(1) == 2 and Child()(1) == 2 and Plain()(3) == 4
