"""Memory of a target + drafter pair: parameters and per-token cache bytes, and totals at a context length.

The drafter reuses the target's embedding and LM head, so its own parameters are only its layers, fc and
norms. Per request, the target's KV cache grows by 2 x attention layers x kv_heads x head_dim values per token,
the drafter's context cache by the same for its (few) layers; a draft window caps the latter. A hybrid target's
linear-attention layers hold fixed-size states per request instead (`linear_state_bytes`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.packing import packed_bytes
from blockdraft.modeling.target import TargetModel


def param_bytes(module: nn.Module) -> int:
    """Bytes of `module`'s distinct parameters plus its prepacked weights (`blockdraft.modeling.packing`)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total + packed_bytes(module)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Cache bytes one token adds: a key and a value per layer and KV head."""
    return 2 * layers * kv_heads * head_dim * itemsize


def attention_layers(cfg: dict[str, Any]) -> int:
    """Layers with a KV cache: all but a hybrid target's linear-attention layers."""
    return cfg["num_hidden_layers"] - sum(kind == "linear_attention" for kind in cfg.get("layer_types") or ())


def linear_state_bytes(cfg: dict[str, Any], itemsize: int) -> int:
    """One request's linear-attention states (hybrid targets; 0 otherwise): per such layer a convolution state
    of the last kernel-size projected inputs, in the model's dtype, and a recurrent state of value heads x key
    dim x value dim, kept in float32."""
    layers = cfg["num_hidden_layers"] - attention_layers(cfg)
    if not layers:
        return 0
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    conv = (2 * hk * dk + hv * dv) * cfg.get("linear_conv_kernel_dim", 4) * itemsize
    return layers * (conv + hv * dk * dv * 4)


def memory_report(target: TargetModel, drafter: Drafter | None, context: int = 1024,
                  draft_window: int | None = None, draft_head: nn.Module | None = None) -> dict[str, Any]:
    """`draft_head`: the drafter's own copy of its vocabulary's LM-head rows (`blockdraft.modeling.draft_vocab`), if any."""
    cfg = target.config_dict()
    size = torch.empty(0, dtype=target.dtype).element_size()
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    target_kv = kv_bytes_per_token(attention_layers(cfg), heads, head_dim, size)
    report: dict[str, Any] = {"context_tokens": context, "target_parameters_bytes": param_bytes(target.model),
                              "target_kv_bytes_per_token": target_kv,
                              "target_kv_bytes": target_kv * context + linear_state_bytes(cfg, size)}
    if drafter is not None:
        d = drafter.config
        draft_kv = kv_bytes_per_token(d.num_hidden_layers, d.num_key_value_heads, d.head_dim, drafter.dtype.itemsize)
        kept = context if draft_window is None else min(context, draft_window)
        own_head = param_bytes(draft_head) if draft_head is not None else 0
        report.update(drafter_parameters_bytes=param_bytes(drafter) + own_head, drafter_cache_bytes_per_token=draft_kv,
                      drafter_cache_bytes=draft_kv * kept, draft_window=draft_window)
    report["total_bytes"] = sum(v for k, v in report.items()
                                if k in ("target_parameters_bytes", "target_kv_bytes", "drafter_parameters_bytes",
                                         "drafter_cache_bytes"))
    return report


def describe(report: dict[str, Any]) -> str:
    mb = 2**20
    text = (f"target {report['target_parameters_bytes'] / mb:.0f} MB + KV {report['target_kv_bytes'] / mb:.1f} MB"
            f" at {report['context_tokens']} tokens")
    if "drafter_parameters_bytes" in report:
        text += (f" | drafter {report['drafter_parameters_bytes'] / mb:.1f} MB + cache "
                 f"{report['drafter_cache_bytes'] / mb:.2f} MB")
    return text
