"""Anchored training blocks: the DFlash training semantics, in one place.

For a sequence of T tokens with a loss mask, anchors are positions p where tokens p and p+1 are both
supervised. Anchor p makes the block [token p, MASK x (B-1)] at positions p..p+B-1. All blocks of a
sequence train in one forward: queries = all blocks, keys = [context (the whole sequence) ; all blocks].

    context key j visible to block n   iff  j < p_n          (strict: the anchor's features do not exist yet)
    block key of block m visible       iff  m == n           (bidirectional inside a block, nothing across)
    label of slot k >= 1 of block n    =    token at p_n + k (no shift); slot 0 and tokens outside the
                                            sequence or the loss mask are ignored (IGNORE)
The mask is built from original positions and block membership, never from block indices alone, so
overlapping blocks (dense anchors) stay separate.

Target labels (`greedy`): on text the target did not write itself, slot k instead learns g[p_n + k - 1],
the target's own greedy token after the data's tokens up to p_n + k - 1, and only while the data followed
the target through slots 1..k-1 (token p_n + j == g[p_n + j - 1] for j < k). Every kept label is then
exactly the token the target would decode at that slot after that block's anchor, so any corpus trains the
drafter on the target's own choices; slot 1 always keeps its label, deeper slots only where the text
agrees with the target. On the target's own greedy answers this gives the data labels back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import create_block_mask

from blockdraft.modeling.drafter import GroupedMask, MaskFn, layer_rule, visibility

IGNORE = -100
GROUPS = 8  # query groups of `grouped_mask_fn` (measured on a 2-core CPU: docs/training.md)


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions p (1-D) with loss_mask[p] and loss_mask[p + 1] both set."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_anchors(loss_mask: torch.Tensor, max_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `max_anchors` distinct random anchors, sorted (re-drawn every epoch by the caller's generator)."""
    cand = anchor_candidates(loss_mask)
    if cand.numel() > max_anchors:
        cand = cand[torch.randperm(cand.numel(), generator=generator)[:max_anchors]]
    return cand.sort().values


@dataclass
class Blocks:
    """A padded batch of anchored blocks. b sequences, N anchor slots each, block size B."""

    input_ids: torch.Tensor   # (b, N*B) block tokens: anchor token then MASKs
    positions: torch.Tensor   # (b, N*B) absolute positions p_n + k
    labels: torch.Tensor      # (b, N*B) target token or IGNORE
    anchors: torch.Tensor     # (b, N) anchor positions (0 for padding slots)
    valid: torch.Tensor       # (b, N) bool, real anchor slots
    block_size: int


def build_blocks(tokens: list[torch.Tensor], loss_masks: list[torch.Tensor], anchors: list[torch.Tensor],
                 block_size: int, mask_token_id: int, context_len: int,
                 greedy: list[torch.Tensor] | None = None) -> Blocks:
    """Blocks for b sequences (tokens[i] (T_i,), anchors[i] (N_i,)), padded to N = max N_i and T = context_len.

    greedy[i] (T_i,): the target's greedy next token after each position of sequence i; given, the labels are
    the target's (see the module docstring), else the data's."""
    b, B = len(tokens), block_size
    n_max = max(1, max(a.numel() for a in anchors))
    anchor_pos = torch.zeros(b, n_max, dtype=torch.long)
    valid = torch.zeros(b, n_max, dtype=torch.bool)
    for i, a in enumerate(anchors):
        anchor_pos[i, : a.numel()] = a
        valid[i, : a.numel()] = True
    offsets = torch.arange(B)
    positions = anchor_pos[:, :, None] + offsets  # (b, N, B)
    input_ids = torch.full((b, n_max, B), mask_token_id, dtype=torch.long)
    labels = torch.full((b, n_max, B), IGNORE, dtype=torch.long)
    for i, (tok, lm) in enumerate(zip(tokens, loss_masks)):
        input_ids[i, :, 0] = tok[anchor_pos[i]]
        pos = positions[i, :, 1:]
        inside = pos < tok.numel()
        safe = pos.clamp_max(tok.numel() - 1)
        supervised = inside & lm.bool()[safe] & valid[i, :, None]
        if greedy is None:
            labels[i, :, 1:] = torch.where(supervised, tok[safe], IGNORE)
        else:
            own = greedy[i][(pos - 1).clamp_max(tok.numel() - 1)].where(inside, IGNORE)  # (N, B-1)
            followed = (tok[safe] == own).long().cumprod(-1)  # the data agreed with the target up to slot k
            keep = supervised & torch.cat([torch.ones_like(followed[:, :1]), followed[:, :-1]], 1).bool()
            labels[i, :, 1:] = torch.where(keep, own, IGNORE)
    return Blocks(input_ids.view(b, -1), positions.view(b, -1), labels.view(b, -1), anchor_pos, valid, B)


def block_mask(anchors: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    """(b, 1, N*B, T + N*B) visibility for blocks anchored at `anchors` (b, N) over a T-token context."""
    b, n = anchors.shape
    device = anchors.device
    q_anchor = anchors.repeat_interleave(block_size, dim=1)                              # (b, N*B)
    ctx = torch.arange(context_len, device=device)[None, None, :] < q_anchor[:, :, None]  # strict: j < p_n
    block_id = torch.arange(n, device=device).repeat_interleave(block_size)              # (N*B,)
    same = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, same], dim=2)[:, None]


def dense_mask_fn(blocks: Blocks, context_len: int, device: torch.device) -> MaskFn:
    """Per-layer-kind dense masks: the block mask ANDed with the layer's causal / window rule (SDPA).

    Built on `device` from the anchors (a (b, 1, N*B, T + N*B) mask is hundreds of MB at GPU batch sizes)."""
    base = block_mask(blocks.anchors.to(device), blocks.block_size, context_len)
    q_pos = blocks.positions.to(device)
    ctx_pos = torch.arange(context_len, device=device).expand(q_pos.shape[0], -1)
    k_pos = torch.cat([ctx_pos, q_pos], dim=1)
    return lambda causal, window: visibility(q_pos, k_pos, causal, window, base)  # noqa: E731


def grouped_mask_fn(blocks: Blocks, context_len: int, device: torch.device, groups: int | None = None) -> MaskFn:
    """The dense masks cut into `groups` runs of consecutive blocks (`GroupedMask`). Anchors are sorted, so a
    run's queries see the context before its largest anchor only: the keys past it and the other runs' block
    keys are left out of its attention instead of being masked. With 64 blocks over a 1,024-token context
    that is ~3x less attention than the dense mask, for the same result."""
    dense = dense_mask_fn(blocks, context_len, device)
    n, size, groups = blocks.anchors.shape[1], blocks.block_size, groups or GROUPS
    bounds = sorted({round(i * n / groups) for i in range(groups + 1)})
    spans = [(slice(lo * size, hi * size), int(blocks.anchors[:, lo:hi].max())) for lo, hi in zip(bounds, bounds[1:])]

    def make(causal: bool, window: int | None) -> GroupedMask:
        full = dense(causal, window)  # (b, 1, Q, T + Q)
        return GroupedMask([(q, c, torch.cat([full[:, :, q, :c], full[:, :, q, context_len + q.start:context_len + q.stop]],
                                            dim=-1)) for q, c in spans])
    return make


def flex_mask_fn(blocks: Blocks, context_len: int, device: torch.device) -> MaskFn:
    """The same masks as flex_attention BlockMasks: sparse, never materialised (GPU training)."""
    anchors = blocks.anchors.to(device)
    B, T = blocks.block_size, context_len
    b, n = anchors.shape

    def make(causal: bool, window: int | None):
        def mask_mod(bi, _h, q_idx, kv_idx):
            q_block = q_idx // B
            q_pos = anchors[bi, q_block] + q_idx % B
            is_ctx = kv_idx < T
            k_blk = (kv_idx - T).clamp(min=0)
            k_pos = torch.where(is_ctx, kv_idx, anchors[bi, k_blk // B] + k_blk % B)
            ok = torch.where(is_ctx, kv_idx < anchors[bi, q_block], k_blk // B == q_block)
            return ok & layer_rule(q_pos - k_pos, causal, window)
        return create_block_mask(mask_mod, b, None, n * B, T + n * B, device=str(device))
    return make
