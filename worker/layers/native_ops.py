"""The one way a module takes the compiled CPU kernels (`worker/native.py`).

`prepare_for_device` hands the loaded module to every `UsesNative` module of a model on CPU;
until then, and wherever the kernels are off or did not build, `native` is None and the
module runs its torch ops (the reference the kernels are tested against).
"""

from __future__ import annotations

from types import ModuleType


class UsesNative:
    native: ModuleType | None = None

    def use_native(self, ops: ModuleType) -> None:
        self.native = ops
