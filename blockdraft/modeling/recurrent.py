"""State rollback for hybrid targets, whose linear-attention layers carry states instead of K/V rows.

Qwen3.5 / Qwen3.6 and Qwen3-Next mix full-attention layers with linear-attention layers (the gated delta rule):
each of those keeps a short convolution state (the last kernel-1 projected inputs) and a recurrent state
(heads x key dim x value dim) that every token updates. A verify feeds the block's drafts through them too, and
unlike K/V rows the rejected tokens' updates cannot be cut away afterwards.

How the states get back to the committed length (measured in `docs/hybrid.md`, `scripts/rollback_cost.py`): as a
forward reaches a linear-attention layer, a hook snapshots the layer's two states and keeps the layer's input
(a reference, no copy). Rolling back to L tokens restores the snapshot and runs the layer alone again over its
kept inputs of the tokens that stay (L - the forward's start). Attention is causal, so those inputs are exactly
what the layer would have been given had only the committed tokens been fed: the states come back as if the
rejected drafts had never been seen, and only the linear-attention layers run again, over a few tokens, instead
of the whole model. Full-attention layers are cut as usual.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from blockdraft.errors import IncompatibleModelsError

LINEAR_MIXER = "linear_attn"  # the gated delta rule module of a Hugging Face hybrid decoder layer
# hybrids whose linear-attention layers we roll back (each is in the tests' parity matrix)
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
# token mixers that carry a state instead of K/V rows, by the module names transformers gives them
STATEFUL_MIXERS = (LINEAR_MIXER, "mamba", "mixer", "conv", "short_conv", "temporal_block", "ssm")


def linear_attention_layers(layers: nn.ModuleList) -> list[int]:
    """Indices of the decoder layers whose token mixer is linear attention (empty for a plain transformer)."""
    return [i for i, layer in enumerate(layers) if hasattr(layer, LINEAR_MIXER)]


def check_mixers(config: Any, layers: nn.ModuleList, architecture: str) -> None:
    """A target whose layers carry recurrent state must be one of `HYBRID_FAMILIES`, else a one-line error."""
    kinds = set(getattr(config, "layer_types", None) or ()) | set(getattr(config, "layers_block_type", None) or ())
    stateful = {k for k in kinds if not k.endswith("attention") or k == "linear_attention"}
    stateful |= {name for layer in layers for name, _ in layer.named_children() if name in STATEFUL_MIXERS}
    family = getattr(config, "model_type", None)
    if stateful and family not in HYBRID_FAMILIES:
        raise IncompatibleModelsError(
            f"target architecture {architecture} ({family}) has layers with a recurrent state "
            f"({', '.join(sorted(stateful))}) that blockdraft cannot roll back after a verify; supported hybrids: "
            f"{', '.join(HYBRID_FAMILIES)}")


@dataclass
class _Kept:
    """A linear-attention layer's states as the last forward reached it (None: not started yet), and its input."""
    conv: torch.Tensor | None
    recurrent: torch.Tensor | None
    inputs: torch.Tensor  # (b, T, D)


def _clone(states: dict[int, torch.Tensor | None], ready: dict[int, bool]) -> torch.Tensor | None:
    return states[0].clone() if ready[0] else None


@functools.cache
def hybrid_cache_class() -> type:
    """transformers' `DynamicCache` for a hybrid model (K/V rows for the attention layers, states for the
    linear-attention ones) plus what `StateRollback` keeps of the last forward; built on first use, so importing
    blockdraft does not import transformers."""
    from transformers import DynamicCache

    class HybridCache(DynamicCache):
        def __init__(self, config: Any) -> None:
            super().__init__(config=config)
            self.start = 0  # where the last forward started
            self.recording = False
            self.kept: dict[int, _Kept] = {}

    return HybridCache


class StateRollback:
    """Keeps, per forward, what the linear-attention layers need to be put back at any committed length."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.layer_ids = linear_attention_layers(layers)
        self.mixers = {i: getattr(layers[i], LINEAR_MIXER) for i in self.layer_ids}
        self._hooks = [self.mixers[i].register_forward_pre_hook(self._keeper(i), with_kwargs=True)
                       for i in self.layer_ids]

    def _keeper(self, i: int):
        def keep(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            cache = kwargs.get("cache")
            if isinstance(cache, hybrid_cache_class()) and cache.recording:
                layer = cache.layers[i]
                inputs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                cache.kept[i] = _Kept(_clone(layer.conv_states, layer.is_conv_states_initialized),
                                      _clone(layer.recurrent_states, layer.is_recurrent_states_initialized), inputs)
        return keep

    @staticmethod
    def begin(cache: Any, start: int) -> None:
        """A forward of tokens at start.. is about to run on `cache`: keep the states it starts from."""
        if cache.get_seq_length() != start:
            raise ValueError(f"a hybrid target's forward must start at its cache's end ({cache.get_seq_length()} "
                             f"tokens), not at {start}: roll the cache back first")
        cache.start, cache.kept, cache.recording = start, {}, True

    @staticmethod
    def end(cache: Any) -> None:
        cache.recording = False

    @torch.inference_mode()
    def rollback(self, cache: Any, length: int) -> None:
        """Cut `cache` to its first `length` tokens: attention rows cropped, linear-attention states restored to
        the last forward's start and run again over the kept inputs of the tokens that stay."""
        total = cache.get_seq_length()
        if length >= total:
            return
        if length == 0:
            self._reset(cache, total)
            return
        if length < cache.start:
            raise ValueError(f"cannot roll a hybrid target's cache back to {length} tokens: its linear-attention "
                             f"states go back to {cache.start} tokens at most (where the last forward started)")
        self._crop_attention(cache, total - length)
        keep = length - cache.start
        for i in self.layer_ids:
            kept, layer = cache.kept[i], cache.layers[i]
            _restore(layer, kept)
            if keep:
                self.mixers[i](hidden_states=kept.inputs[:, :keep], cache=cache)

    def _reset(self, cache: Any, total: int) -> None:
        self._crop_attention(cache, total)
        for i in self.layer_ids:
            cache.layers[i].reset()
        cache.start, cache.kept = 0, {}

    def _crop_attention(self, cache: Any, extra: int) -> None:
        linear = set(self.layer_ids)
        for i, layer in enumerate(cache.layers):
            if i not in linear:
                layer.crop(-extra)


def _restore(layer: Any, kept: _Kept) -> None:
    """Put a linear-attention cache layer back to the states `kept` saw (a fresh layer where it had none)."""
    if kept.recurrent is None or kept.conv is None:
        layer.reset()
        return
    layer.conv_states[0].copy_(kept.conv)
    layer.recurrent_states[0].copy_(kept.recurrent)
    layer.has_previous_state[0] = True
