"""State rollback for hybrid targets, whose linear-attention layers carry states instead of K/V rows.

Qwen3.5 / Qwen3.6 and Qwen3-Next mix full-attention layers with linear-attention layers (the gated delta rule):
each of those keeps a short convolution state (the last kernel-1 projected inputs) and a recurrent state
(heads x key dim x value dim) that every token updates. A verify feeds the block's drafts through them too, and
unlike K/V rows the rejected tokens' updates cannot be cut away afterwards.

How the states get back to the committed length (measured in `docs/hybrid.md`, `scripts/rollback_cost.py`): the
cache records the convolution's inputs past its kernel (transformers' `activate_past_recording`), and as a forward
reaches a linear-attention layer a hook copies the layer's recurrent state and keeps the layer's input (a
reference). Rolling back to L tokens keeps the recorded inputs up to the last token that stays (L - the forward's
start = n of them): they are the new convolution state, and the convolution over them gives those n tokens'
queries, keys and values again; their gates come from the layer's two small gate projections (hidden size x
heads) of the kept inputs; and the gated delta rule runs n steps from the copied state (the model's own
kernels). Attention is causal, so all of it is exactly what feeding only the committed tokens would have given:
no weight matrix of the layer is read again, which a re-run of the layer (about half of a Qwen3.5-0.8B
layer's weights) or of the whole model would. Full-attention layers are cut as usual.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
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
    """What the last forward left of a linear-attention layer: its recurrent state before (None: the layer had
    none yet), how many recorded convolution inputs came before the forward's, and the layer's input."""
    recurrent: torch.Tensor | None  # (b, value heads, key dim, value dim), float32
    conv_before: int
    inputs: torch.Tensor  # (b, T, D)


@functools.cache
def hybrid_cache_class() -> type:
    """transformers' `DynamicCache` for a hybrid model (K/V rows for the attention layers, states for the
    linear-attention ones) plus what `StateRollback` keeps of the last forward; built on first use, so importing
    blockdraft does not import transformers."""
    from transformers import DynamicCache

    class HybridCache(DynamicCache):
        def __init__(self, config: Any) -> None:
            super().__init__(config=config)
            self.activate_past_recording()  # the convolution's inputs stay until `StateRollback` cuts them
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
                ready = layer.is_recurrent_states_initialized[0] and layer.has_previous_state[0]
                conv = layer.conv_states[0] if layer.has_previous_state[0] else None
                cache.kept[i] = _Kept(layer.recurrent_states[0].clone() if ready else None,
                                      0 if conv is None else conv.shape[-1],
                                      kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])
        return keep

    def begin(self, cache: Any, start: int) -> None:
        """A forward of tokens at start.. is about to run on `cache`: drop recorded convolution inputs older than
        the kernel needs, and keep what the forward starts from (`_keeper`)."""
        if cache.get_seq_length() != start:
            raise ValueError(f"a hybrid target's forward must start at its cache's end ({cache.get_seq_length()} "
                             f"tokens), not at {start}: roll the cache back first")
        for i in self.layer_ids:
            layer = cache.layers[i]
            if layer.is_conv_states_initialized[0]:
                layer.conv_states[0] = layer.conv_states[0][..., -layer.conv_kernel_size[0]:]
        cache.start, cache.kept, cache.recording = start, {}, True

    @staticmethod
    def end(cache: Any) -> None:
        cache.recording = False

    @torch.inference_mode()
    def rollback(self, cache: Any, length: int) -> None:
        """Cut `cache` to its first `length` tokens: attention rows cropped, each linear-attention layer's states
        recomputed for the tokens of the last forward that stay (`_recompute`)."""
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
        for i in self.layer_ids:
            _recompute(self.mixers[i], cache.layers[i], cache.kept[i], length - cache.start)

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


def _recompute(mixer: nn.Module, layer: Any, kept: _Kept, n: int) -> None:
    """Put a linear-attention cache layer where feeding only the first `n` tokens of the last forward would have
    left it. The recorded convolution inputs (`conv_before` older ones, then the forward's) up to the n-th are its
    new convolution state; their convolution gives the n tokens' queries, keys and values; the gated delta rule
    runs from the kept recurrent state. `mixer`'s own kernels (its modeling module's) do the arithmetic."""
    inputs = layer.conv_states[0][..., : kept.conv_before + n]  # (b, conv dim, before + n)
    layer.conv_states[0] = inputs
    if n == 0:
        if kept.recurrent is None:
            layer.reset()
        else:
            layer.recurrent_states[0].copy_(kept.recurrent)
        return
    kernels = sys.modules[type(mixer).__module__]
    mixed = kernels.causal_conv1d_fn(inputs, mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias,
                                     activation=mixer.activation)[..., -n:].transpose(1, 2)  # (b, n, conv dim)
    q, k, v = torch.split(mixed, [mixer.key_dim, mixer.key_dim, mixer.value_dim], dim=-1)
    b, a = _gate_inputs(mixer, kept.inputs[:, :n])  # (b, n, value heads) each
    _, state = kernels.torch_recurrent_gated_delta_rule(
        q.unflatten(-1, (-1, mixer.head_k_dim)), k.unflatten(-1, (-1, mixer.head_k_dim)),
        v.unflatten(-1, (-1, mixer.head_v_dim)), g=-mixer.A_log.float().exp() * F.softplus(a.float() + mixer.dt_bias),
        beta=b.sigmoid(), initial_state=kept.recurrent, output_final_state=True, use_qk_l2norm_in_kernel=True)
    layer.recurrent_states[0].copy_(state)
    layer.has_previous_state[0] = True


def _gate_inputs(mixer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (b, a) gate pre-activations of inputs x (b, n, D): Qwen3.5's two projections, or Qwen3-Next's one
    projection in its per-key-head layout (unpacked by the layer's own method; the q/k/v/z part is not needed)."""
    if hasattr(mixer, "in_proj_ba"):
        qkvz = x.new_zeros(*x.shape[:-1], 2 * (mixer.key_dim + mixer.value_dim))
        return mixer.fix_query_key_value_ordering(qkvz, mixer.in_proj_ba(x))[4:]
    return mixer.in_proj_b(x), mixer.in_proj_a(x)
