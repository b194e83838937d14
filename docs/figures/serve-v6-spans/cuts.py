"""Forward at 8/16 rows with MT-Bench-like row positions: cut by span (default call_keys) vs one call per run
(call_keys huge), alternating, 16 rounds each. Run from the repository root: .venv/bin/python docs/figures/serve-v6-spans/cuts.py"""
import random, time, torch, statistics
from blockdraft.api import Pipeline
p = Pipeline.load(); t = p.engine.target
R = 16; CAP = 700
cache = t.new_cache(rows=R, capacity=CAP)
torch.manual_seed(0); random.seed(1)
# chat-templated token counts of MT-Bench first turns for the default target (a sample of the 80)
L = [42, 44, 47, 48, 49, 50, 52, 53, 54, 56, 58, 60, 61, 63, 65, 68, 70, 71, 73, 81, 83, 85, 87, 92, 100, 106, 106, 120, 138, 170, 196, 227, 243, 245, 286, 380]
with torch.inference_mode():
    for r in range(R):
        t.forward(torch.randint(0, 1000, (1, CAP - 20)), cache, 0, rows=[r], features=False)
    default = t.call_keys
    cases = []
    for rows in (8, 16):
        for k in range(3):
            starts = [random.choice(L) + random.randint(0, 256) for _ in range(rows)]
            cases.append((f"{rows} rows plain #{k}", starts, [1] * rows))
        starts = [random.choice(L) + random.randint(0, 256) for _ in range(rows)]
        lengths = [random.choice([1, 1, 1, 4]) for _ in range(rows)]
        cases.append((f"{rows} rows lookups {lengths}", starts, lengths))
    for name, starts, lengths in cases:
        b = len(starts); ids = torch.randint(0, 1000, (b, max(lengths)))
        res = {"one call": [], "cuts": []}
        for rep in range(16):
            for mode in (("one call", "cuts") if rep % 2 == 0 else ("cuts", "one call")):
                t.call_keys = 10**9 if mode == "one call" else default
                t0 = time.perf_counter()
                t.forward(ids, cache, starts, features=True, lengths=lengths)
                res[mode].append(time.perf_counter() - t0)
                for r in range(b): t.rollback(cache, starts[r], row=r)
        a, c = statistics.median(res["one call"]) * 1000, statistics.median(res["cuts"]) * 1000
        print(f"{name:40s} span {max(starts)+max(lengths):4d} mean {sum(starts)/b:5.0f}: one call {a:6.1f} ms, cuts {c:6.1f} ms ({c/a:.3f})", flush=True)
