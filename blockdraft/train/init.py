"""Start a drafter from the target's own last layers instead of random weights.

The drafter's layers have the target's shapes (hidden size, heads, MLP), so its k layers can begin as copies
of the target's last k decoder layers, its final norm as the target's, and `fc` as a selector of the
deepest target feature (the input of the first copied layer), `hidden_norm` as that layer's input norm.
Then the drafter's first layer sees the context exactly as the target's layer L-k does, and its output
lands where the target's LM head reads next-token predictions: training starts from "a shallow copy of
the target's top" rather than from noise. Per-head q/k norms (which Llama/Qwen2 targets lack) start at 1.
"""
from __future__ import annotations

import logging

import torch

from blockdraft.errors import IncompatibleModelsError
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.target import TargetModel

log = logging.getLogger(__name__)


@torch.no_grad()
def init_from_target(drafter: Drafter, target: TargetModel) -> Drafter:
    cfg, k = drafter.config, drafter.config.num_hidden_layers
    source = target.layers[-k:]
    for mine, theirs in zip(drafter.layers, source):
        for name, param in mine.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")) and _get(theirs, name) is None:
                param.fill_(1.0)
                continue
            value = _get(theirs, name)
            if value is None or value.shape != param.shape:
                raise IncompatibleModelsError(f"cannot start drafter parameter {name} {tuple(param.shape)} from "
                                              f"the target's layer: {None if value is None else tuple(value.shape)}")
            param.copy_(value)
    drafter.norm.weight.copy_(target.model.get_decoder().norm.weight)
    drafter.hidden_norm.weight.copy_(source[0].input_layernorm.weight)
    d, deepest = cfg.hidden_size, max(range(cfg.num_features), key=lambda i: cfg.target_layer_ids[i])
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, deepest * d:(deepest + 1) * d] = torch.eye(d)
    first = target.num_layers - k
    if cfg.target_layer_ids[deepest] != first - 1:
        log.warning("drafter layers start as target layers %d..%d, whose input is layer %d's output, but the "
                    "deepest feature is layer %d", first, target.num_layers - 1, first - 1,
                    cfg.target_layer_ids[deepest])
    return drafter


def _get(module: torch.nn.Module, dotted: str) -> torch.Tensor | None:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module
