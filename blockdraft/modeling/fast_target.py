"""Fast path for Llama / Qwen2 / Qwen3 targets: our own forward over the Hugging Face weights.

Same interface as `TargetModel`, plus batching: a static KV cache (layers, rows, kv heads, capacity, d)
written in place at each token's position. Visibility comes from positions (key j is visible to a query at
position p iff j <= p), so rolling back is free: stale entries past a row's committed length are simply
overwritten by the next forward, never copied or cropped. The leaf modules (projections, norms, MLP,
rotary tables) are the Hugging Face model's own, so weights are shared, not copied.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.modeling.drafter import apply_rope, rms_norm
from blockdraft.modeling.packing import PackedLinear, can_pack, fuse_linears
from blockdraft.modeling.target import TargetModel, path_moves

FAST_FAMILIES = ("llama", "qwen2", "qwen3")


def supports_fast_path(model: nn.Module) -> bool:
    """Llama / Qwen2 / Qwen3 with full attention in every layer (sliding-window targets use the HF path)."""
    config = model.config
    return getattr(config, "model_type", None) in FAST_FAMILIES and not getattr(config, "use_sliding_window", False)


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Hugging Face Llama / Qwen RMSNorm module's computation, through `blockdraft.modeling.drafter.rms_norm`."""
    return rms_norm(x, norm.weight, norm.variance_epsilon)


class StaticKVCache:
    """K/V for `rows` sequences; grows by doubling when a forward needs more positions."""

    def __init__(self, num_layers: int, rows: int, n_kv: int, head_dim: int, capacity: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (num_layers, rows, n_kv, capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * rows  # committed tokens per row (host side: no syncs)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def ensure(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        cap = max(needed, 2 * self.capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:3], cap, old.shape[4])
            new[:, :, :, : old.shape[3]] = old
            setattr(self, name, new)

    def get_seq_length(self, row: int = 0) -> int:
        return self.lengths[row]

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class FastTarget(TargetModel):
    """A Llama / Qwen2 / Qwen3 target run by our own loop; numerically the HF forward, without its overhead."""

    def __init__(self, model: nn.Module, tokenizer: Any = None) -> None:
        if not supports_fast_path(model):
            raise ValueError(f"fast path supports {FAST_FAMILIES}, not {model.config.model_type!r}")
        super().__init__(model, tokenizer)
        decoder = model.get_decoder()
        self.final_norm = decoder.norm
        self.rotary = decoder.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.n_kv = model.config.num_key_value_heads
        self.scaling = attn.scaling
        self.has_qk_norm = hasattr(attn, "q_norm")
        self.n_heads = model.config.num_attention_heads
        self._fused: list[tuple[PackedLinear, PackedLinear]] = []  # per layer: (q|k|v, gate|up), once packed
        self.call_keys = max(1, round(CALL_ROW_KEYS * 576 / (self.n_heads * self.head_dim)))  # see `_by_span`

    def pack(self) -> bool:
        """Packing (see TargetModel.pack), with each layer's q/k/v and gate/up projections fused into one
        packed layer apiece (two calls per layer fewer). The Hugging Face modules get `Slice`s of them, so
        the model's own forward keeps working."""
        if self.packed or not can_pack(self.device, self.dtype):
            return self.packed
        self._fused = [(fuse_linears(layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                        fuse_linears(layer.mlp, ("gate_proj", "up_proj"))) for layer in self.layers]
        return super().pack()

    def set_feature_layers(self, layer_ids: list[int]) -> None:
        super().set_feature_layers(layer_ids)
        for h in self._hooks:  # features are captured in our own loop
            h.remove()
        self._hooks = []

    def new_cache(self, rows: int = 1, capacity: int = 256) -> StaticKVCache:
        return StaticKVCache(self.num_layers, rows, self.n_kv, self.head_dim, capacity, self.device, self.dtype)

    @staticmethod
    def rollback(cache: StaticKVCache, length: int, row: int = 0) -> None:
        cache.lengths[row] = min(cache.lengths[row], length)

    @staticmethod
    @torch.inference_mode()
    def keep_path(cache: StaticKVCache, start: int, path: list[int], row: int = 0) -> None:
        """`TargetModel.keep_path` for cache row `row` of the static cache."""
        src, dst = path_moves(start, path)
        if src is None:
            return
        for t in (cache.k[:, row], cache.v[:, row]):  # (layers, kv heads, capacity, d) views
            device = t.device
            t.index_copy_(2, dst.to(device), t.index_select(2, src.to(device)))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache, start: int | Sequence[int], *,
                features: bool = True, last_only: bool = False, rows: Sequence[int] | None = None,
                lengths: Sequence[int] | None = None,
                tree: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (b, q) of cache rows `rows` (default 0..b-1) at positions start[i]..start[i]+q-1.

        Returns logits (b, q or 1, V) and, when `features`, the selected layers' outputs (b, q, K*D).

        With `lengths` (real tokens per row, <= q; the rest is padding), a ragged batch: the projections and
        the MLP run on the real tokens only (a batch where one row verifies 5 tokens and seven verify 1 costs
        12 tokens' work, not 40), attention on the padded rows (padding sits after a row's real tokens, so
        causal masking hides it and the caller's rollback discards it). Logits (sum(lengths), V) and features
        (sum(lengths), K*D) then come flat, the rows' real tokens one after another.

        With `tree` = (depths (b, q), visible (b, q, q) bool), each row's tokens are a draft tree: token j of
        row i sits at position start[i] + depths[i, j] (the rotary embedding) but in cache slot start[i] + j,
        and attends to the cache before start[i] and to the tokens t of its own row with visible[i, j, t] (its
        ancestors and itself, `blockdraft.decoding.tree`). `keep_path` then moves the accepted ones into place.
        """
        b, q = input_ids.shape
        if lengths is not None and (last_only or len(lengths) != b or not all(1 <= n <= q for n in lengths)):
            raise ValueError(f"lengths={list(lengths)}: expected {b} lengths in 1..{q}, without last_only")
        starts = [start] * b if isinstance(start, int) else list(start)
        span = max(starts) + q
        cache.ensure(span)
        device = input_ids.device
        slots = torch.tensor(starts, device=device)[:, None] + torch.arange(q, device=device)  # (b, q)
        positions = slots if tree is None else slots - torch.arange(q, device=device) + tree[0]
        row_idx = torch.arange(b, device=device) if rows is None else torch.tensor(list(rows), device=device)
        contiguous = rows is None
        runs = [(0, b, 0)] if contiguous else _runs(list(rows))
        if device.type == "cpu" and b > 1:  # each stretch of rows attends over its own longest row's keys
            runs = _by_span(runs, [s + q for s in starts], self.call_keys)
        else:
            runs = [(lo, hi, first, span) for lo, hi, first in runs]
        mask = None
        if not (b == 1 and q == 1):  # additive, built once (SDPA would convert a boolean mask in every layer)
            visible = _visible(slots, span, None if tree is None else tree[1])
            mask = torch.zeros(visible.shape, device=device, dtype=self.dtype).masked_fill_(~visible, float("-inf"))
            mask = mask[:, None]  # (b, 1, q, span)
        # one slice per layer when the rows are 0..b-1 and share a start (a single request, or a prefill)
        at = slice(starts[0], starts[0] + q) if contiguous and len(set(starts)) == 1 else None
        x = self.embedding(input_ids)
        cos, sin = self.rotary(x, positions)
        cos, sin = cos[:, None], sin[:, None]
        real = None  # flat indices of the real tokens among the b * q, when some are padding
        if lengths is not None and sum(lengths) < b * q:
            real = (torch.arange(q, device=device)[None] < torch.tensor(list(lengths), device=device)[:, None])
            real = real.flatten().nonzero().squeeze(1)
            x = x.flatten(0, 1)[real]  # (T, D)
        elif lengths is not None:
            x = x.flatten(0, 1)
        extra = _extra_queries(list(lengths), runs, q) if lengths is not None and device.type == "cpu" else None
        wanted = set(self.feature_layer_ids) if features else set()
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            h = _rms_norm(layer.input_layernorm, x)
            x = x + self._attention(i, layer, h, cache, slots, row_idx, runs, at, cos, sin, mask,
                                    None if lengths is None else (real, b, q), extra)
            x = x + self._mlp(i, layer, _rms_norm(layer.post_attention_layernorm, x))
            if i in wanted:
                captured[i] = x
        for r, s in zip(row_idx.tolist() if not contiguous else range(b), starts):
            cache.lengths[r] = s + q
        h = _rms_norm(self.final_norm, x[:, -1:] if last_only else x)
        feats = torch.cat([captured[i] for i in self.feature_layer_ids], dim=-1) if features else None
        return self.lm_head(h), feats

    def _attention(self, i: int, layer: nn.Module, h: torch.Tensor, cache: StaticKVCache, slots: torch.Tensor,
                   row_idx: torch.Tensor, runs: list[tuple[int, int, int, int]], at: slice | None,
                   cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                   ragged: tuple[torch.Tensor | None, int, int] | None = None,
                   extra: list[tuple[int, int, int, int, int]] | None = None) -> torch.Tensor:
        """Self-attention of layer i. `ragged` = (real, b, q): h holds the real tokens flat (T, D); the
        projections run on them, attention on the rows padded to (b, q), or, with `extra` (`_extra_queries`),
        every row's first query at once and the further queries of the rows that have them apart. `runs`
        (`_runs`, `_by_span`): (lo, hi, first, span) = the batch's rows lo..hi-1 sit in cache rows
        first..first+hi-lo-1 and attend to their first `span` keys; each run attends to a view of its cache
        rows (a gather of scattered rows would copy their keys and values every layer: +17% on a 16-row
        cycle)."""
        attn = layer.self_attn
        if self._fused:
            qkv = self._fused[i][0](h)
        else:
            qkv = torch.cat([attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)], dim=-1)
        if ragged is not None:
            qkv = _scatter(qkv, *ragged)
        b, q, _ = qkv.shape
        heads = qkv.view(b, q, -1, self.head_dim)  # (b, q, H + 2 Hkv, d): queries, keys, values
        n_q = self.n_heads
        qk, vs = heads[:, :, : n_q + self.n_kv], heads[:, :, n_q + self.n_kv:]
        if self.has_qk_norm:
            qk = torch.cat([_rms_norm(attn.q_norm, qk[:, :, :n_q]), _rms_norm(attn.k_norm, qk[:, :, n_q:])], dim=2)
        qk = apply_rope(qk.transpose(1, 2), cos, sin)  # queries and keys in one rotation
        qs, ks = qk[:, :n_q], qk[:, n_q:]
        vs = vs.transpose(1, 2)
        if at is not None:
            cache.k[i, :b, :, at], cache.v[i, :b, :, at] = ks, vs
        else:
            cache.k[i, row_idx[:, None], :, slots] = ks.transpose(1, 2)
            cache.v[i, row_idx[:, None], :, slots] = vs.transpose(1, 2)
        keys, values = cache.k[i], cache.v[i]

        def attend(lo: int, hi: int, first: int, span: int, queries: slice) -> torch.Tensor:
            return self._attend(qs[lo:hi, :, queries], keys[first:first + hi - lo, :, :span],
                                values[first:first + hi - lo, :, :span],
                                None if mask is None else mask[lo:hi, :, queries, :span])

        if extra is None:
            parts = [attend(*run, slice(None)) for run in runs]
            out = parts[0] if len(parts) == 1 else torch.cat(parts)
        else:  # a row's padding queries are left unset: `_gather` drops them
            out = qs.new_empty(qs.shape)
            out[:, :, :1] = torch.cat([attend(*run, slice(0, 1)) for run in runs])
            for lo, hi, first, n, span in extra:
                out[lo:hi, :, 1:n] = attend(lo, hi, first, span, slice(1, n))
        out = out.transpose(1, 2).reshape(b, q, -1)
        return attn.o_proj(out if ragged is None else _gather(out, ragged[0]))

    def _attend(self, qs: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        if _grouped(qs):
            return _grouped_attention(qs, keys, values, mask, self.scaling)
        return F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=self.scaling,
                                              enable_gqa=qs.shape[1] != keys.shape[1])

    def _mlp(self, i: int, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        mlp = layer.mlp
        if not self._fused:
            return mlp(h)
        gate, up = self._fused[i][1](h).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)


def _visible(slots: torch.Tensor, span: int, tree: torch.Tensor | None) -> torch.Tensor:
    """(b, q, span) bool: which cache slots each query sees. Causal by slot; with `tree` (b, q, q), the cache
    before each row's first slot plus the row's own tree slots that `tree` shows it."""
    keys = torch.arange(span, device=slots.device)[None, None, :]
    if tree is None:
        return keys <= slots[:, :, None]
    b, q = slots.shape
    visible = (keys < slots[:, :1, None]).repeat(1, q, 1)
    rows = torch.arange(b, device=slots.device)[:, None, None]
    queries = torch.arange(q, device=slots.device)[None, :, None]
    visible[rows, queries, slots[:, None, :]] = tree
    return visible


def _runs(rows: list[int]) -> list[tuple[int, int, int]]:
    """The batch's rows as runs of consecutive cache rows: (lo, hi, first) = batch rows lo..hi-1 are cache rows
    first..first+hi-lo-1. [0, 1, 2, 5, 6] -> [(0, 3, 0), (3, 5, 5)]."""
    runs: list[tuple[int, int, int]] = []
    for i, r in enumerate(rows):
        if runs and r == runs[-1][2] + i - runs[-1][0]:
            runs[-1] = (runs[-1][0], i + 1, runs[-1][2])
        else:
            runs.append((i, i + 1, r))
    return runs


# an attention call's fixed cost, in keys of one row: ~45 us a call against ~0.14 us a row's key at 9 heads x 64
# dims (torch's SDPA on a 2-core CPU, 1-16 rows of 50-800 keys, one query); a key costs in proportion to heads x
# head dims, so a target with other heads scales it by 576 / (heads x head dims)
CALL_ROW_KEYS = 320


def _by_span(runs: list[tuple[int, int, int]], ends: list[int], call_keys: int,
             longest: int = 16) -> list[tuple[int, int, int, int]]:
    """Runs of consecutive cache rows (`_runs`) cut into stretches (lo, hi, first, span) that each attend over
    their own longest row's keys (`ends`: each row's last position + 1) instead of the batch's: one call reads
    every row's keys up to the longest row's end, the others' past their own end masked (with the default
    target's MT-Bench prompts of 42-402 tokens, a 16-row batch's longest row holds about twice the mean's
    keys). A cut costs one call (`call_keys` keys of one row) and saves the keys the shorter stretch no longer
    reads; the cuts are chosen by dynamic programming over each run, with stretches of at most `longest` rows
    (past that one call costs more per key: 16 rows of 800 keys take 2.3 ms, two calls of 8 rows 1.8)."""
    out = []
    for lo, hi, first in runs:
        row_ends = ends[lo:hi]
        if len(row_ends) <= longest and (max(row_ends) - min(row_ends)) * len(row_ends) <= call_keys:  # no cut pays
            out.append((lo, hi, first, max(row_ends)))
            continue
        cost, cut = [0.0] + [math.inf] * len(row_ends), [0] * (len(row_ends) + 1)
        for j in range(1, len(row_ends) + 1):  # cost[j]: the cheapest way to attend rows 0..j-1 of the run
            reach = 0
            for i in range(j - 1, max(j - longest, 0) - 1, -1):
                reach = max(reach, row_ends[i])
                c = cost[i] + call_keys + (j - i) * reach
                if c < cost[j]:
                    cost[j], cut[j] = c, i
        pieces, j = [], len(row_ends)
        while j > 0:
            i = cut[j]
            pieces.append((lo + i, lo + j, first + i, max(row_ends[i:j])))
            j = i
        out += reversed(pieces)
    return out


# attention's cost per row of a call, in units of one query's: each further query adds EXTRA_QUERY, each call
# CALL (its slicing and copies; measured with torch's CPU kernels on a 2-core CPU, 8-16 rows of ~300 keys)
EXTRA_QUERY, CALL = 0.5, 1.5


def _extra_queries(lengths: list[int], runs: list[tuple[int, int, int, int]],
                   q: int) -> list[tuple[int, int, int, int, int]] | None:
    """How a ragged batch's attention runs on a CPU: None = every run padded to q queries, else every row's
    first query at once plus, for each stretch of consecutive rows with more (lo, hi, first, n, span: its
    run's), their queries 1..n-1, whichever is estimated cheaper. A batch where one row verifies 5 tokens and
    15 verify 1 pads 75 queries that attend to every key; apart, it attends 16 + 4 (at 16 rows: 1.2 ms a
    layer instead of 2.7)."""
    extra = []
    for lo, hi, first, span in runs:
        i = lo
        while i < hi:
            if lengths[i] == 1:
                i += 1
                continue
            j = i
            while j < hi and lengths[j] > 1:
                j += 1
            extra.append((i, j, first + i - lo, max(lengths[i:j]), span))
            i = j
    rows = len(lengths)
    padded = len(runs) * CALL + rows * (1 + EXTRA_QUERY * (q - 1))
    apart = len(runs) * CALL + rows + sum(CALL + (hi - lo) * (1 + EXTRA_QUERY * (n - 2)) for lo, hi, _, n, _ in extra)
    return extra if extra and apart < padded else None


def _scatter(flat: torch.Tensor, real: torch.Tensor | None, b: int, q: int) -> torch.Tensor:
    """(T, D) real tokens -> (b, q, D), zeros at the padding (`real`: their flat indices; None: no padding)."""
    if real is None:
        return flat.view(b, q, -1)
    return flat.new_zeros(b * q, flat.shape[-1]).index_copy_(0, real, flat).view(b, q, -1)


def _gather(padded: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """(b, q, D) -> (T, D): the real tokens, rows one after another."""
    flat = padded.flatten(0, 1)
    return flat if real is None else flat[real]


def _grouped(qs: torch.Tensor) -> bool:
    """Attention by `_grouped_attention`: on a CPU, for a batch of rows with a few queries each (a verify).
    There torch's SDPA kernel takes 2-3x longer for q = 2..8 than for q = 1 (measured on a 2-core CPU at 8-16
    rows; it stays the better choice for one row and for prefills)."""
    return qs.device.type == "cpu" and qs.shape[0] > 1 and 1 < qs.shape[2] <= 16


def _grouped_attention(qs: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with the query heads that share a key/value head stacked into one matmul
    (queries (b, H, q, d), keys and values (b, Hkv, L, d), additive mask (b, 1, q, L)) -> (b, H, q, d)."""
    b, heads, q, d = qs.shape
    kv, span = keys.shape[1], keys.shape[2]
    group = heads // kv  # query head h reads key/value head h // group
    scores = qs.reshape(b, kv, group * q, d) @ keys.transpose(-1, -2)  # (b, Hkv, group * q, L)
    weights = (scores.view(b, kv, group, q, span) * scale + mask[:, :, None]).softmax(-1)
    return (weights.view(b, kv, group * q, span) @ values).view(b, heads, q, d)
