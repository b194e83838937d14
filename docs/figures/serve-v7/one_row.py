"""One request at a time through Batch(rows=1) (the FIFO server's), Batch(rows=16) (the default server's,
row 0) and engine.decode (Pipeline.stream's), the order alternating per prompt; outputs asserted identical.
Run from the repository root: .venv/bin/python docs/figures/serve-v7/one_row.py [PROMPTS] [ROUNDS]."""
import sys
import time
from collections import Counter

import torch

from blockdraft.api import Pipeline
from blockdraft.bench.datasets import bench_prompts
from blockdraft.decoding.batch_engine import Batch
from blockdraft.decoding.stats import GenerationStats

torch.set_num_threads(2)
pipe = Pipeline.load()
eng = pipe.engine
block = pipe.drafter.config.block_size
batches = {r: Batch(eng, r, capacity=4096 + block + 1) for r in (1, 16)}
eng.adaptive_policy()
for r in (2, 4, 8, 16):
    eng.calibrate_batch(r)
prompts = bench_prompts("mt-bench", int(sys.argv[1]) if len(sys.argv) > 1 else 8, 0)
reqs = [pipe.prepare(messages=list(p.messages), max_new_tokens=256) for p in prompts]

@torch.inference_mode()
def run_batch(rows, req):
    b = batches[rows]
    st = eng.begin(req.prompt_ids, req.options, GenerationStats(1))
    b.admit(st, 0)
    t0 = time.perf_counter()
    out = list(b.prefill(0))
    while not st.done:
        out += b.cycle([0])[0]
    dt = time.perf_counter() - t0
    b.release(0)
    return out, dt, Counter(st.stats.sources)

@torch.inference_mode()
def run_decode(req):
    st = GenerationStats(1)
    t0 = time.perf_counter()
    out = [t for c in eng.decode(req.prompt_ids, req.options, st) for t in c]
    return out, time.perf_counter() - t0, Counter(st.sources)

sides = {"rows1": lambda q: run_batch(1, q), "rows16": lambda q: run_batch(16, q), "decode": run_decode}
tot = {k: [0, 0.0, Counter()] for k in sides}
for rnd in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    for i, q in enumerate(reqs):
        order = list(sides) if (i + rnd) % 2 == 0 else list(sides)[::-1]
        outs = {}
        for k in order:
            out, dt, src = sides[k](q)
            outs[k] = out
            tot[k][0] += len(out); tot[k][1] += dt; tot[k][2] += src
            print(f"r{rnd} p{i} {k}: {len(out)} tok {dt:.2f}s {len(out)/dt:.1f} tok/s {dict(src)}", flush=True)
        assert len({tuple(o) for o in outs.values()}) == 1, "outputs differ"
for k, (n, s, src) in tot.items():
    print(f"{k}: {n/s:.2f} tok/s {dict(src)}")
