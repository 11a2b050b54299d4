"""The base of kvledger's model modules: an `nn.Module` whose call is its `forward`.

`nn.Module.__call__` checks for hooks, tracing and forward pre-hooks on every call before it
reaches `forward`; kvledger registers none, and a decode step calls ~200 modules of a 30-layer
model (each linear layer, norm, attention and MLP): at one row the checks are a visible share
of a small model's step (docs/performance.md, "Python around the kernels"). A subclass that
defines `forward` gets it as `__call__` too, so `module(x)` runs just that. Hooks registered on
such a module are not called.
"""

from __future__ import annotations

from torch import nn


class Module(nn.Module):
    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls.__call__ = cls.forward  # type: ignore[method-assign]
