"""The target's verify cost curve: seconds for one forward of q new tokens at a given context length.

On a GPU verifying 16 tokens costs about as much as 1; on a CPU it does not (here ~1.5-4x), so this curve
decides the break-even acceptance length and how many drafts are worth verifying.
"""
from __future__ import annotations

import hashlib
import json
import logging
import statistics

import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.fast_target import FastTarget
from blockdraft.files import atomic_path, cache_home
from blockdraft.stats import now
from blockdraft.target import TargetModel

log = logging.getLogger(__name__)

FORWARD_VERSION = 2  # part of the cache key: bumped whenever the fast path's forward kernels change


@torch.inference_mode()
def verify_cost_curve(target: TargetModel, max_tokens: int, context: int = 300, repeats: int = 5,
                      seed: int = 0, rows: int = 1) -> dict[int, float]:
    """{q: median seconds of a forward of q new tokens in each of `rows` rows (features captured, as in
    verification)} for q = 1..max_tokens. Batches (rows > 1) need the fast path."""
    if rows > 1 and not isinstance(target, FastTarget):
        raise InvalidArgumentError(f"a {rows}-row cost curve needs a fast-path target, not {type(target).__name__}")
    g = torch.Generator().manual_seed(seed)
    device = target.device
    prompt = torch.randint(0, target.vocab_size, (rows, context), generator=g).to(device)
    cache = target.new_cache() if rows == 1 else target.new_cache(rows, context + max_tokens + 1)
    target.forward(prompt, cache, 0, features=bool(target.feature_layer_ids), last_only=True)
    curve: dict[int, float] = {}
    for q in range(1, max_tokens + 1):
        step = torch.randint(0, target.vocab_size, (rows, q), generator=g).to(device)
        times = []
        for r in range(repeats + 1):
            t0 = now(device)
            target.forward(step, cache, context, features=bool(target.feature_layer_ids))
            if r:  # the first run warms up
                times.append(now(device) - t0)
            _rollback(target, cache, context, rows)
        curve[q] = statistics.median(times)
    return curve


def _rollback(target: TargetModel, cache: object, length: int, rows: int) -> None:
    if rows == 1:
        target.rollback(cache, length)
    else:
        for row in range(rows):
            target.rollback(cache, length, row=row)


def cost_key(target: TargetModel, max_tokens: int, context: int, rows: int = 1) -> str:
    """What the curve depends on: the model's shape, device, dtype, threads, packed layers, sizes, rows."""
    shape = {k: target.config_dict().get(k) for k in ("model_type", "hidden_size", "intermediate_size",
                                                      "num_hidden_layers", "num_attention_heads",
                                                      "num_key_value_heads", "vocab_size")}
    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu{torch.get_num_threads()}"
    blob = json.dumps([shape, type(target).__name__, name, str(target.dtype), max_tokens, context, FORWARD_VERSION]
                      + (["packed, fused q/k/v and gate/up"] if target.packed else [])
                      + ([f"{rows} rows"] if rows > 1 else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_cost_curve(target: TargetModel, max_tokens: int, context: int = 300, rows: int = 1) -> dict[int, float]:
    """`verify_cost_curve`, measured once per model shape / device / dtype / threads / rows and kept under
    `cache_home()/costs` (delete the file to re-measure)."""
    path = cache_home() / "costs" / f"{cost_key(target, max_tokens, context, rows)}.json"
    if path.is_file():
        return {int(q): s for q, s in json.loads(path.read_text()).items()}
    log.info("measuring the verify cost curve (%d row(s), q = 1..%d at context %d); cached at %s",
             rows, max_tokens, context, path)
    curve = verify_cost_curve(target, max_tokens, context, rows=rows)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(curve))
    return curve
