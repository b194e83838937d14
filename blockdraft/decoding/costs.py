"""The target's verify cost curve: seconds for one forward of q new tokens at a given context length.

On a GPU verifying 16 tokens costs about as much as 1; on a CPU it does not (here ~1.5-4x), so this curve
decides the break-even acceptance length and how many drafts are worth verifying.
"""
from __future__ import annotations

import hashlib
import json
import logging
import platform
from pathlib import Path
from statistics import median

import torch

from blockdraft.decoding.stats import now
from blockdraft.errors import InvalidArgumentError
from blockdraft.files import atomic_path, cache_home
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.target import TargetModel

log = logging.getLogger(__name__)

STATISTICS = {"min": min, "median": median}  # how a size's timed rounds become its cost

FORWARD_VERSION = 6  # part of the cache key: bumped whenever the fast path's forward kernels or the way
# the curve is measured change (5: batch curves of ragged verifies, grouped CPU attention; 6: a ragged batch's
# further queries attend apart from the first ones; the per-stretch keys of `fast_target._by_span` leave the
# curves alone: their rows' positions differ by at most `rows`, too little for a cut)


@torch.inference_mode()
def verify_cost_curve(target: TargetModel, max_tokens: int, context: int = 300, repeats: int = 5,
                      seed: int = 0, rows: int = 1, statistic: str = "min") -> dict[int, float]:
    """{q: seconds of a verify forward of q new tokens (features captured, as in verification)} for
    q = 1..max_tokens. With `rows` > 1 (the fast path), a ragged batch as `Batch.cycle` runs it: one row
    verifies q tokens and the others 1 each, at slightly different positions (so the cache is written by
    index, as when requests of different lengths share the batch).

    The sizes are measured in rounds, each round timing every q once, in reverse order every other round
    (after one untimed warm-up round): a machine whose speed drifts during the measurement (a neighbour on a
    shared host, a clock change) then shifts every q alike instead of bending the curve. Each q keeps its
    fastest round (`statistic="min"`: interference only ever adds time) or its median round ("median", see
    `report_cost_curve`), and the curve is made non-decreasing in q (`monotone`): a forward of more tokens
    never costs less, so a dip or a spike at one q is noise that would otherwise steer the adaptive policy to
    or away from that exact length."""
    if statistic not in STATISTICS:
        raise InvalidArgumentError(f"statistic={statistic!r}: expected one of {sorted(STATISTICS)}")
    if rows > 1 and not isinstance(target, FastTarget):
        raise InvalidArgumentError(f"a {rows}-row cost curve needs a fast-path target, not {type(target).__name__}")
    g = torch.Generator().manual_seed(seed)
    device = target.device
    prompt = torch.randint(0, target.vocab_size, (rows, context), generator=g).to(device)
    cache = target.new_cache() if rows == 1 else target.new_cache(rows, context + max_tokens + 1)
    features = bool(target.feature_layer_ids)
    target.forward(prompt, cache, 0, features=features, last_only=True)
    steps = {q: torch.randint(0, target.vocab_size, (rows, q), generator=g).to(device)
             for q in range(1, max_tokens + 1)}
    starts = context if rows == 1 else [context - r for r in range(rows)]
    times: dict[int, list[float]] = {q: [] for q in steps}
    for r in range(repeats + 1):
        for q in (steps if r % 2 == 0 else reversed(steps)):
            ragged = {} if rows == 1 else {"lengths": [q] + [1] * (rows - 1)}
            t0 = now(device)
            target.forward(steps[q], cache, starts, features=features, **ragged)
            if r:  # the first round warms up
                times[q].append(now(device) - t0)
            _rollback(target, cache, context, rows)
    return dict(zip(steps, monotone([STATISTICS[statistic](times[q]) for q in steps])))


def report_cost_curve(target: TargetModel, max_tokens: int, context: int) -> dict[int, float]:
    """The curve a report prices work and break-even with: each size's median over 9 rounds.

    The fastest of 5 rounds (what the adaptive policy measures once and caches) wanders between runs on a
    shared CPU: on the default target, 8 runs back to back gave c(6)/c(1) with a standard deviation of 0.13
    and c(16)/c(1) of 0.29; the median round halves both (0.07, 0.14), so two reports of one pair agree
    more closely."""
    return verify_cost_curve(target, max_tokens, context, repeats=9, statistic="median")


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence to `values` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def _rollback(target: TargetModel, cache: object, length: int, rows: int) -> None:
    if rows == 1:
        target.rollback(cache, length)
    else:
        for row in range(rows):
            target.rollback(cache, length, row=row)


def cost_key(target: TargetModel, max_tokens: int, context: int, rows: int = 1) -> str:
    """What the curve depends on: the model's shape, device (a CPU: threads, kernels, model), dtype, packed
    layers, sizes, rows."""
    shape = {k: target.config_dict().get(k) for k in ("model_type", "hidden_size", "intermediate_size",
                                                      "num_hidden_layers", "num_attention_heads",
                                                      "num_key_value_heads", "vocab_size")}
    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    blob = json.dumps([shape, type(target).__name__, name, str(target.dtype), max_tokens, context, FORWARD_VERSION]
                      + (["packed, fused q/k/v and gate/up"] if target.packed else [])
                      + ([f"{rows} rows"] if rows > 1 else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cpu_name() -> str:
    """The CPU as far as speed goes: threads, the kernels torch picked (AVX2 / AVX512 ...) and the model name,
    so a cache directory shared between machines (or a VM moved to another host) never serves another CPU's
    curve."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:  # not Linux
        model = platform.processor()
    return f"cpu{torch.get_num_threads()} {torch.backends.cpu.get_cpu_capability()} {model}"


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
