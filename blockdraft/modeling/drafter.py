"""The DFlash drafter: a small block-diffusion transformer conditioned on target features.

Shapes: b = batch, Q = block tokens (queries), C = context tokens, D = hidden size,
H / Hkv = query / key-value heads, d = head_dim, K = number of target features.

Each layer is the Qwen3 decoder layer except for attention: queries come from the block only, keys and
values are [k_proj(ctx); k_proj(block)] and [v_proj(ctx); v_proj(block)] with the SAME projections, k-norm
and RoPE at absolute positions. Context tokens never pass through q/o/MLP, so their K/V are computed once
per committed token and cached (`DraftCache`). Block entries are never cached.
The drafter owns no embedding and no LM head: the target's are used (frozen).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.packing import PackedLinear, can_pack, pack_linears

KV = tuple[torch.Tensor, torch.Tensor]  # (b, Hkv, C, d) each


@dataclass
class GroupedMask:
    """Dense masks per group of consecutive queries (training on a CPU, `train.blocks.grouped_mask_fn`): the
    queries `q` of a group attend to the first `c` context keys and to the block keys at the same places as
    themselves, `mask` (b, 1, |q|, c + |q|) over those keys. Every key left out is invisible to the group, so
    the product over the kept ones is exact, and it skips most of a dense mask's hidden area."""

    groups: list[tuple[slice, int, torch.Tensor]]  # (q, c, mask)


Mask = Union[torch.Tensor, BlockMask, GroupedMask, None]  # dense bool (b, 1, Q, Kv), flex, grouped, or all visible
MaskFn = Callable[[bool, Optional[int]], Mask]  # (causal, window) -> the mask of that layer kind


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama / Qwen RMSNorm (normalise in fp32, cast back, scale) through `F.rms_norm`: two calls from
    Python instead of six (on a CPU `F.rms_norm` still runs its steps as separate kernels)."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary(nn.Module):
    """RoPE tables for absolute positions (default or linear-scaled).

    The frequencies are a plain float32 attribute, not a buffer, so `.to(bfloat16)` cannot round them.
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        elif kind == "llama3":
            inv_freq = _llama3_frequencies(inv_freq, scaling)
        self.inv_freq = inv_freq.float()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (b, T) -> cos, sin (b, 1, T, d), broadcastable over heads."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        angles = positions[..., None].float() * self.inv_freq  # (b, T, d/2)
        emb = torch.cat([angles, angles], dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _llama3_frequencies(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1 RoPE scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * torch.pi / inv_freq
    smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen < old / high, inv_freq, torch.where(wavelen > old / low, inv_freq / factor, scaled))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (b, h, T, d) rotated by the tables of its T positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def layer_rule(diff: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """Which keys a layer kind lets a query see, from diff = q_pos - k_pos (any shape) -> bool.

    `causal`: keys at positions <= the query's. `window`: q_pos - k_pos < window (and, when not causal,
    k_pos - q_pos < window). Elementwise, so dense masks and flex mask_mods share it.
    """
    ok = diff >= 0 if causal else torch.ones_like(diff, dtype=torch.bool)
    if window is not None:
        ok = ok & ((diff < window) if causal else (diff.abs() < window))
    return ok


def visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None,
               base: torch.Tensor | None = None) -> torch.Tensor | None:
    """Boolean attention mask (b, 1, Q, Kv) from positions (b, Q), (b, Kv), True = visible; None when all
    is visible. `base` (the training mask: anchor-strict context, same-block keys) is ANDed in."""
    if not causal and window is None:
        return base
    layer = layer_rule(q_pos[:, :, None] - k_pos[:, None, :], causal, window)[:, None]
    return layer if base is None else base & layer


_COMPILED_FLEX: dict[str, Callable] = {}


def _flex(device: torch.device) -> Callable:
    """flex_attention, compiled on GPU (where it is fast); eager elsewhere (correct, for tests)."""
    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED_FLEX:
        _COMPILED_FLEX["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX["cuda"]


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)  # (b, n, T, d)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Keys (k-norm, RoPE) and values of tokens x (b, T, D) -> (b, Hkv, T, d) each."""
        return self.finish_kv(self.k_proj(x), self.v_proj(x), cos, sin)

    def finish_kv(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Projected keys and values (b, T, Hkv*d) -> heads, with k-norm and RoPE on the keys."""
        return apply_rope(self.k_norm(self._heads(k, self.n_kv)), cos, sin), self._heads(v, self.n_kv)

    def forward(self, x: torch.Tensor, ctx: KV, cos: torch.Tensor, sin: torch.Tensor, mask: Mask) -> torch.Tensor:
        """Block x (b, Q, D) attends to [ctx ; block] keys; returns (b, Q, D)."""
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)), cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        k = torch.cat([ctx[0], k_blk], dim=2)
        v = torch.cat([ctx[1], v_blk], dim=2)
        gqa = self.n_heads != self.n_kv
        if isinstance(mask, BlockMask):
            out = _flex(q.device)(q, k, v, block_mask=mask, enable_gqa=gqa)
        elif isinstance(mask, GroupedMask):
            out = torch.cat([F.scaled_dot_product_attention(
                q[:, :, qs], torch.cat([ctx[0][:, :, :c], k_blk[:, :, qs]], 2),
                torch.cat([ctx[1][:, :, :c], v_blk[:, :, qs]], 2), attn_mask=m, enable_gqa=gqa)
                for qs, c, m in mask.groups], dim=2)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: KV, cos: torch.Tensor, sin: torch.Tensor, mask: Mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftCache:
    """Per-layer K/V of committed context tokens, preallocated and grown by doubling.

    Context positions are contiguous, so the cache is buffers plus counts. Block K/V are never stored here:
    a draft forward only reads this cache. With `window`, only the last `window` context tokens are kept
    (memory bounded per request on long contexts; the keys carry their absolute RoPE positions).
    """

    def __init__(self, num_layers: int, window: int | None = None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"draft cache window={window}: expected >= 1 or None")
        self.num_layers, self.window = num_layers, window
        self.length = 0           # context tokens seen (absolute positions 0..length-1)
        self._first = 0           # buffer index of the oldest kept token
        self._used = 0            # buffer slots written
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []

    @property
    def offset(self) -> int:
        """Absolute position of the oldest context token kept."""
        return self.length - (self._used - self._first)

    def append(self, kvs: list[KV]) -> None:
        new = kvs[0][0].shape[2]
        if not self._k:
            cap = max(64, new)
            for k, v in kvs:
                self._k.append(k.new_empty(*k.shape[:2], cap, k.shape[3]))
                self._v.append(v.new_empty(*v.shape[:2], cap, v.shape[3]))
        self._make_room(new)
        for i, (k, v) in enumerate(kvs):
            self._k[i][:, :, self._used:self._used + new] = k
            self._v[i][:, :, self._used:self._used + new] = v
        self._used += new
        self.length += new
        if self.window is not None:
            self._first = max(self._first, self._used - self.window)

    def _make_room(self, new: int) -> None:
        cap = self._k[0].shape[2]
        if self._used + new <= cap:
            return
        if self._first:  # windowed: move the kept tokens to the front instead of growing
            kept = self._used - self._first
            for t in self._k + self._v:
                t[:, :, :kept] = t[:, :, self._first:self._used].clone()
            self._first, self._used = 0, kept
        if self._used + new > cap:
            cap = max(2 * cap, self._used + new)
            self._k = [_grow(t, cap, self._used) for t in self._k]
            self._v = [_grow(t, cap, self._used) for t in self._v]

    def layer(self, i: int) -> KV:
        return self._k[i][:, :, self._first:self._used], self._v[i][:, :, self._first:self._used]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._k + self._v)


def _grow(t: torch.Tensor, cap: int, used: int) -> torch.Tensor:
    out = t.new_empty(*t.shape[:2], cap, t.shape[3])
    out[:, :, :used] = t[:, :, :used]
    return out


class Drafter(nn.Module):
    """DFlash draft model. Parameter names match the published checkpoint keys."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.num_features * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)
        self.packed = False
        self.draft_vocab: torch.Tensor | None = None  # token ids it may propose (`blockdraft.modeling.draft_vocab`)

    def pack(self) -> bool:
        """Prepack the decoder layers' linears and `fc` for CPU inference (`blockdraft.modeling.packing`), in place;
        k_proj and v_proj keep their dense weights too (the stacked context projection reads them). A packed
        drafter cannot be trained or saved. False where packing does not apply."""
        if self.packed or not can_pack(self.device, self.dtype):
            return self.packed
        kv = tuple(p for layer in self.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj))
        pack_linears(self.layers, keep_dense=kv)
        self.fc = PackedLinear(self.fc)
        self.packed = True
        return True

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "Drafter":
        """Random initialisation (normal(0, std) linears, unit norms), reproducible from `seed`."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Target features (b, C, K*D) at positions (b, C) -> every layer's context K/V.

        One matmul projects the context into all layers' keys and values at once (the layers' k/v
        weights stacked); each committed token goes through it once.
        """
        ctx = self.hidden_norm(self.fc(features.to(self.dtype)))
        cos, sin = self.rotary(positions, ctx.dtype)
        parts = F.linear(ctx, *self._stacked_kv()).split(self.config.num_key_value_heads * self.config.head_dim, -1)
        return [layer.self_attn.finish_kv(parts[2 * i], parts[2 * i + 1], cos, sin)
                for i, layer in enumerate(self.layers)]

    def _stacked_kv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer's k_proj and v_proj stacked: weight (2 L Hkv d, D), bias or None. Rebuilt whenever a
        weight changed (training, loading), cached otherwise."""
        projs = [p for layer in self.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)]
        params = [t for p in projs for t in (p.weight, p.bias) if t is not None]
        key = tuple((t.data_ptr(), t._version) for t in params)
        if torch.is_grad_enabled() or getattr(self, "_stacked_key", None) != key:
            weight = torch.cat([p.weight for p in projs])
            bias = torch.cat([p.bias for p in projs]) if projs[0].bias is not None else None
            if torch.is_grad_enabled():
                return weight, bias
            self._stacked, self._stacked_key = (weight, bias), key
        return self._stacked

    def forward(self, block: torch.Tensor, positions: torch.Tensor, ctx: list[KV],
                ctx_positions: torch.Tensor, mask_fn: MaskFn | None = None) -> torch.Tensor:
        """Block embeddings (b, Q, D) at positions (b, Q) -> final hidden states (b, Q, D).

        `ctx` holds each layer's context K/V at `ctx_positions` (b, C). `mask_fn(causal, window)` gives the
        attention mask of a layer kind: training passes its anchored-block masks (dense or flex); at
        inference it is None and masks come from positions alone (the block sees all context and itself).
        """
        x = block.to(self.dtype)
        if self.config.input_embedding_scale != 1.0:
            x = x * self.config.input_embedding_scale
        cos, sin = self.rotary(positions, x.dtype)
        if mask_fn is None:
            k_pos = torch.cat([ctx_positions, positions], dim=1)
            mask_fn = lambda causal, window: visibility(positions, k_pos, causal, window)  # noqa: E731
        masks: dict[tuple[bool, int | None], Mask] = {}
        for i, layer in enumerate(self.layers):
            key = (self.config.layer_causal(i), self.config.layer_window(i))
            if key not in masks:
                masks[key] = mask_fn(*key)
            x = layer(x, ctx[i], cos, sin, masks[key])
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Draft logits through `lm_head`: the target's, or its draft-vocabulary rows (`blockdraft.modeling.draft_vocab`),
        plus the optional published output transforms.

        rows: vocabulary ids to score (training on a sub-vocabulary); None scores them all.
        """
        if rows is None:
            dense = getattr(lm_head, "weight", None)
            logits = lm_head(hidden.to(lm_head.dtype if dense is None else dense.dtype))  # packed heads: no weight
        else:
            bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[rows]
            logits = F.linear(hidden.to(lm_head.weight.dtype), lm_head.weight[rows], bias)
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def draft_many(self, blocks: list[torch.Tensor], starts: list[int], new_features: list[torch.Tensor],
                   caches: list[DraftCache]) -> list[torch.Tensor]:
        """`draft` for several requests in one forward, each with its own cache, position and block length.

        blocks[r] (Q_r, D) sits at positions starts[r]..; new_features[r] (1, C_r, K*D) go into caches[r]
        first (one context projection for all rows). Rows are right-padded to the longest block and context;
        a mask hides the padded keys, padded queries are dropped. Returns hidden states [(Q_r, D)].
        """
        if len(blocks) == 1:
            return [self.draft(blocks[0][None], starts[0], new_features[0], caches[0])[0]]
        self.extend(new_features, caches)
        for cache, start in zip(caches, starts):
            if cache.length != start:
                raise RuntimeError(f"draft cache holds {cache.length} context tokens, block starts at {start}")
        device = blocks[0].device
        q_len = torch.tensor([x.shape[0] for x in blocks], device=device)
        c_len = torch.tensor([c.length - c.offset for c in caches], device=device)
        q_max, c_max = int(q_len.max()), int(c_len.max())
        block = blocks[0].new_zeros(len(blocks), q_max, blocks[0].shape[-1])
        for r, x in enumerate(blocks):
            block[r, : x.shape[0]] = x
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(q_max, device=device)
        offsets = torch.tensor([c.offset for c in caches], device=device)
        ctx_positions = offsets[:, None] + torch.arange(c_max, device=device)
        ctx = [self._padded_context(caches, i, c_max, device) for i in range(len(self.layers))]
        real_q = torch.arange(q_max, device=device) < q_len[:, None]  # (b, Q)
        keys = torch.cat([torch.arange(c_max, device=device) < c_len[:, None], real_q], dim=1)  # (b, C + Q)
        base = keys[:, None, None, :].repeat(1, 1, q_max, 1)  # (b, 1, Q, C + Q)
        # a padded query sees its own key, so that no row of the mask is empty (NaN on some backends)
        base[:, 0, :, c_max:] |= ~real_q[:, :, None] & torch.eye(q_max, dtype=torch.bool, device=device)
        k_pos = torch.cat([ctx_positions, positions], dim=1)
        hidden = self(block, positions, ctx, ctx_positions,
                      lambda causal, window: visibility(positions, k_pos, causal, window, base))
        return [hidden[r, : x.shape[0]] for r, x in enumerate(blocks)]

    def extend(self, new_features: list[torch.Tensor], caches: list[DraftCache]) -> None:
        """Project every row's newly committed features (1, C_r, K*D) in one call and append them to the rows'
        caches (`draft_many` does it first; the engine calls it on its own to time it apart)."""
        rows = [r for r, f in enumerate(new_features) if f.shape[1]]
        if not rows:
            return
        sizes = [new_features[r].shape[1] for r in rows]
        feats = torch.cat([new_features[r] for r in rows], dim=1)  # (1, sum C_r, K*D)
        pos = torch.cat([torch.arange(caches[r].length, caches[r].length + n, device=feats.device)
                         for r, n in zip(rows, sizes)])[None]
        kvs = self.context_kv(feats, pos)
        for j, r in enumerate(rows):
            first = sum(sizes[:j])
            caches[r].append([(k[:, :, first:first + sizes[j]], v[:, :, first:first + sizes[j]]) for k, v in kvs])

    def _padded_context(self, caches: list[DraftCache], i: int, c_max: int, device: torch.device) -> KV:
        """Layer i's context K/V of every row, right-padded to c_max tokens: (b, Hkv, c_max, d) each."""
        cfg = self.config
        k = torch.zeros(len(caches), cfg.num_key_value_heads, c_max, cfg.head_dim, device=device, dtype=self.dtype)
        v = torch.zeros_like(k)
        for r, cache in enumerate(caches):
            if cache.length - cache.offset:
                ck, cv = cache.layer(i)
                k[r, :, : ck.shape[2]], v[r, :, : cv.shape[2]] = ck[0], cv[0]
        return k, v

    def draft(self, block: torch.Tensor, start: int, new_features: torch.Tensor, cache: DraftCache) -> torch.Tensor:
        """Inference: append newly committed features to `cache`, then run the block at `start`.

        block (b, Q, D) sits at positions start..start+Q-1; new_features (b, C, K*D) are the committed
        tokens at positions cache.length..start-1. Returns hidden states (b, Q, D).
        """
        b, q_len = block.shape[:2]
        if new_features.shape[1]:
            pos = torch.arange(cache.length, cache.length + new_features.shape[1], device=block.device)
            cache.append(self.context_kv(new_features, pos.expand(b, -1)))
        if cache.length != start:
            raise RuntimeError(f"draft cache holds {cache.length} context tokens, block starts at {start}")
        positions = torch.arange(start, start + q_len, device=block.device).expand(b, -1)
        ctx_positions = torch.arange(cache.offset, start, device=block.device).expand(b, -1)
        if cache.length:
            ctx = [cache.layer(i) for i in range(len(self.layers))]
        else:  # anchor at position 0: no context yet
            empty = block.new_zeros(b, self.config.num_key_value_heads, 0, self.config.head_dim)
            ctx = [(empty, empty)] * len(self.layers)
        return self(block, positions, ctx, ctx_positions)
