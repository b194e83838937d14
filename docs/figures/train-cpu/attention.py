import torch, time
from blockdraft.train.blocks import build_blocks, dense_mask_fn, grouped_mask_fn
from blockdraft.modeling.drafter import Attention, GroupedMask
from blockdraft.modeling.config import DrafterConfig
import torch.nn.functional as F
torch.manual_seed(0)
T, N, B, b, H, Hkv, d = 800, 64, 16, 2, 9, 3, 64
anchors = [torch.randperm(T - 20)[:N].sort().values for _ in range(b)]
blocks = build_blocks([torch.arange(T)] * b, [torch.ones(T)] * b, anchors, B, 0, T)
Q = N * B
q = torch.randn(b, H, Q, d, requires_grad=True); kc = torch.randn(b, Hkv, T, d, requires_grad=True); vc = torch.randn(b, Hkv, T, d, requires_grad=True)
kb = torch.randn(b, Hkv, Q, d, requires_grad=True); vb = torch.randn(b, Hkv, Q, d, requires_grad=True)
dense = dense_mask_fn(blocks, T, torch.device("cpu"))(False, None)
def run(kind, groups=8):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if kind == "dense":
            out = F.scaled_dot_product_attention(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2), attn_mask=dense, enable_gqa=True)
        else:
            gm = grouped_mask_fn(blocks, T, torch.device("cpu"), groups)(False, None)
            out = torch.cat([F.scaled_dot_product_attention(q[:, :, s], torch.cat([kc[:, :, :c], kb[:, :, s]], 2), torch.cat([vc[:, :, :c], vb[:, :, s]], 2), attn_mask=m, enable_gqa=True) for s, c, m in gm.groups], 2)
    out.float().square().mean().backward()
def t(kind, g=8, reps=3):
    run(kind, g); s = time.perf_counter()
    for _ in range(reps): run(kind, g)
    return (time.perf_counter() - s) / reps * 1000
for r in range(2):
    print("dense %.0f ms | grouped8 %.0f | grouped16 %.0f | grouped4 %.0f" % (t("dense"), t("g", 8), t("g", 16), t("g", 4)))
