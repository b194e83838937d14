"""Optional compilation: torch.compile (inductor) of the per-layer blocks on CPU and GPU, CUDA graphs on GPU.

Only the dense per-layer pieces are compiled (the target's MLPs, the drafter's decoder layers; the fast path
calls `F.rms_norm` for its norms, outside any module): the decode loop around them stays eager Python (cache
bookkeeping, variable verify lengths), so shapes vary only in the token count, which `dynamic=True` handles
without recompiling per length. On CUDA, mode "reduce-overhead" also captures CUDA graphs. Off by default:
`blockdraft bench` measures whether it pays on a given machine (on a 2-core CPU the q=1 step is memory-bound
and gains little).
"""
from __future__ import annotations

import logging

from torch import nn

from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel

log = logging.getLogger(__name__)

MODES = ("default", "reduce-overhead", "max-autotune")


def compile_pair(target: TargetModel, drafter: Drafter | None, mode: str = "default") -> None:
    """Compile in place. `mode` as torch.compile's; "reduce-overhead" (CUDA graphs) needs a GPU."""
    if mode not in MODES:
        raise InvalidArgumentError(f"compile mode {mode!r}: expected one of {MODES}")
    if mode == "reduce-overhead" and target.device.type != "cuda":
        raise InvalidArgumentError("compile mode 'reduce-overhead' (CUDA graphs) needs a CUDA device")
    if not isinstance(target, FastTarget):
        log.warning("compiling only the drafter: the target is not on the fast path")
    else:
        for layer in target.layers:
            _compile(layer.mlp, mode)
    for layer in drafter.layers if drafter is not None else ():
        _compile(layer, mode)


def _compile(module: nn.Module, mode: str) -> None:
    """In place (`nn.Module.compile`): parameter names and checkpoints are unchanged."""
    module.compile(dynamic=True, mode=mode)
