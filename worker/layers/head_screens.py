"""Which screen finds a model's greedy tokens (--screened-greedy-head), if any.

The two screens (worker/layers/greedy_head.py's bfloat16 one and worker/layers/int8_screen.py's
int8 one) share the decision pass and its constants through greedy_head; the choice between
them lives here, above both, so that neither implementation imports the other's.
"""

from __future__ import annotations

import torch

from worker.layers.greedy_head import ScreenedArgmax
from worker.layers.int8_screen import Int8ScreenedArgmax
from worker.layers.linear import TILE_MAX_ROWS


def screen_for(
    head: object, vocab_size: int, wanted: bool
) -> ScreenedArgmax | Int8ScreenedArgmax | None:
    """The screen of a model's LM head (`model.lm_head` after `prepare_for_device`) when it is
    wanted: a head that keeps float32 tiles (a small float32 model on an AVX-512 CPU, one
    rank) gets the int8 screen of a Q8_0 copy where the CPU runs it (VNNI with VBMI: half the
    bytes of the bfloat16 copy and a tighter bound), else the bfloat16 screen; a Q8_0 head on
    tiles (the exact path's) gets the int8 screen of its own tiles; else None
    (tensor-parallel heads, other types)."""
    if not wanted or getattr(head, "group", None) is not None:
        return None
    tiles = getattr(getattr(head, "cpu_matmul", None), "tiles", None)
    if tiles is None:
        return Int8ScreenedArgmax.for_head(head, vocab_size) if hasattr(head, "ggml_type") else None
    if tiles.dtype == torch.float32:  # float32 tiles exist only where the kernels built
        screen = Int8ScreenedArgmax.for_float_head(tiles, tiles.shape[1], vocab_size)
        if screen is not None:
            return screen
    return ScreenedArgmax.for_head(tiles, vocab_size, TILE_MAX_ROWS)
