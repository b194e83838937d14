"""`blockdraft serve` with every decode cycle timed: a profiling wrapper for load sweeps (docs/serve.md).

    python scripts/serve_cycles.py OUT.json serve --port 8000 [serve options]
    python scripts/serve_cycles.py --summary OUT.json [OUT2.json ...]
    python scripts/serve_cycles.py --levels SWEEP.json NAME=OUT.json [NAME2=OUT2.json ...]

The first form runs `blockdraft serve` with the arguments after OUT.json and, when the server stops, writes
one record per decode cycle: when it ended (epoch seconds), rows in the batch, rows that verified drafts and
how many of them looked-up ones, drafts verified (all rows), rows that verified a tree, tokens committed, seconds (and the parts of them spent proposing drafts and in
the target's forward), whether the rows were contiguous in the cache, and the rows' positions (the longest,
whose keys every row's attention reads, and the mean);
and, next to it (OUT.policy.json), what the adaptive policy measured per batch size (`policy_state`). Use it
as a `serve_sweep` server command
(`--server 'dflash=.venv/bin/python scripts/serve_cycles.py /tmp/dflash-{port}.json serve --port {port}'`).
The second form prints, per file, each (rows, kind: drafter / lookups / plain) group's cycles, median seconds
and tokens per second; the third, per level of a sweep (`serve_sweep`'s sweep.json, servers named as there),
the cycles its server ran while the level did, the time outside them, and the costliest (rows, D: drafter /
L: lookups only / p: plain) groups.
"""
from __future__ import annotations

import atexit
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from blockdraft.decoding.adaptive import DRAFTER, LOOKUP, TREE, AdaptiveVerify
from blockdraft.decoding.batch_engine import Batch
from blockdraft.decoding.engine import SpeculativeEngine
from blockdraft.files import atomic_path
from blockdraft.modeling.fast_target import FastTarget


def record_cycles(out: Path) -> None:
    """Wrap `Batch.cycle` to time each cycle; the records go to `out` when the process exits."""
    records: list[dict] = []
    policy: list[AdaptiveVerify | None] = [None]  # the server's policy, once a cycle has run
    cycle = Batch.cycle
    proposals = keep_proposals()
    parts = time_parts({"propose": (SpeculativeEngine, "propose_many"), "forward": (FastTarget, "forward")})

    def timed(self: Batch, active: list[int] | None = None) -> dict[int, list[int]]:
        active = self.decoding_rows() if active is None else active
        states = [self.states[r] for r in active]
        before = [len(s.stats.sources) for s in states]
        starts = [s.start for s in states]
        policy[0] = self.engine.policy or policy[0]
        parts.clear()
        start = time.perf_counter()
        committed = cycle(self, active)
        sources = [s.stats.sources[-1] for s, n in zip(states, before) if len(s.stats.sources) > n]
        records.append({"at": round(time.time(), 3), "rows": len(active), "seconds": time.perf_counter() - start,
                        "drafted": len(sources), "looked_up": sum(1 for x in sources if x),
                        "tokens": sum(map(len, committed.values())),
                        "verified": sum(p.drafts.numel() for p in proposals),
                        "trees": sum(1 for p in proposals if p.layout() is not None),
                        "contiguous": active == list(range(len(active))),
                        "span": max(starts, default=0), "mean_start": round(sum(starts) / max(len(starts), 1), 1),
                        **{f"{name}_s": round(seconds, 6) for name, seconds in parts.items()}})
        return committed

    def save() -> None:  # after any earlier server's records in `out` (a sweep may start one command twice)
        earlier = json.loads(out.read_text()) if out.exists() else []
        with atomic_path(out) as tmp:
            tmp.write_text(json.dumps(earlier + records))
        if policy[0] is not None:  # what the adaptive policy measured per batch size
            with atomic_path(out.with_suffix(".policy.json")) as tmp:
                tmp.write_text(json.dumps(policy_state(policy[0])))

    Batch.cycle = timed
    atexit.register(save)


def keep_proposals() -> list:
    """Wrap `SpeculativeEngine.propose_many` to keep the last cycle's proposals in the returned list."""
    kept: list = []
    propose = SpeculativeEngine.propose_many

    def keep(*args, **kwargs):
        kept[:] = propose(*args, **kwargs)
        return kept[:]

    SpeculativeEngine.propose_many = keep
    return kept


def time_parts(methods: dict[str, tuple[type, str]]) -> dict[str, float]:
    """Wrap each named method to add its seconds to the returned dict (cleared by the caller per cycle)."""
    spent: dict[str, float] = {}

    def wrap(name: str, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
        return timed

    for name, (owner, attr) in methods.items():
        setattr(owner, attr, wrap(name, getattr(owner, attr)))
    return spent


def policy_state(policy: AdaptiveVerify) -> dict:
    """Per batch size, the decayed [cycles, tokens, seconds] of each kind of cycle (`CycleOutcomes`) and which
    kinds it now decodes without; the same for the drafter's chain and tree cycles, and whether it now drafts
    chains for tree requests; the looked-up drafts' acceptance per match length."""
    return {"outcomes": {rows: {"plain" if k is None else k: [round(x, 3) for x in v] for k, v in o.sums.items()}
                         | {"without": [k for k in (DRAFTER, LOOKUP) if o.use_baseline(k)]}
                         for rows, o in sorted(policy.outcomes.items())},
            "shapes": {rows: {k: [round(x, 3) for x in v] for k, v in o.sums.items()} | {"chains": o.use_baseline(TREE)}
                       for rows, o in sorted(policy.shapes.items())},
            "ngram_rates": {m: round(policy.ngram_rate(m), 3) for m in sorted(policy.ngram_tested)}}


def kind(record: dict) -> str:
    """D: a row verified the drafter's drafts, L: looked-up drafts only, p: plain (records written before commit
    8155f34, 2026-12-03, do not tell lookups apart: D for any drafts)."""
    if not record["drafted"]:
        return "p"
    return "L" if record.get("looked_up", 0) == record["drafted"] else "D"


def by_kind(records: list[dict]) -> dict[tuple[int, str], list[dict]]:
    """Cycle records grouped by (rows in the batch, `kind`)."""
    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["rows"], kind(r))].append(r)
    return groups


def summary(path: Path) -> str:
    records = json.loads(path.read_text())
    groups = by_kind(records)
    total = sum(r["seconds"] for r in records)
    lines = [f"{path}: {len(records)} cycles, {total:.1f} s, {sum(r['tokens'] for r in records)} tokens"]
    names = {"D": "drafter ", "L": "lookups ", "p": "plain   "}
    for (rows, k), group in sorted(groups.items()):
        seconds = sum(r["seconds"] for r in group)
        lines.append(f"  {rows:3d} rows {names[k]}: {len(group):5d} cycles, median "
                     f"{statistics.median(r['seconds'] for r in group) * 1000:6.1f} ms, "
                     f"{sum(r['tokens'] for r in group) / seconds:6.1f} tok/s{shape(group)}")
    return "\n".join(lines)


def shape(group: list[dict]) -> str:
    """The group's mean drafts verified and tokens committed per cycle, and its share of cycles where a row
    verified a tree (records written before commit 59cf227, 2026-12-04, have none of these: empty)."""
    if not group or "verified" not in group[0]:
        return ""
    n = len(group)
    return (f", {sum(r['verified'] for r in group) / n:5.1f} verified {sum(r['tokens'] for r in group) / n:5.2f} "
            f"committed a cycle, trees in {sum(1 for r in group if r['trees']) / n:4.0%}")


def levels(sweep_path: Path, records: dict[str, Path]) -> str:
    """Per level of a `serve_sweep` run (sweep.json), the cycles of its server that ended while the level ran:
    count, seconds, the time outside them (prefills, scheduling, HTTP) and the five costliest (rows, kind)."""
    sweep = json.loads(sweep_path.read_text())
    cycles = {name: json.loads(path.read_text()) for name, path in records.items()}
    lines = []
    for run in (r for r in sweep["runs"] if r["name"] in cycles):
        for lv in (lv for lv in run["levels"] if "started" in lv):  # sweeps before commit 469bbd2 (2026-12-02) have none
            start, end = lv["started"], lv["started"] + lv["wall_s"]
            inside = [r for r in cycles[run["name"]] if start <= r["at"] <= end]
            groups = {kind: [r["seconds"] for r in group] for kind, group in by_kind(inside).items()}
            spent = sum(r["seconds"] for r in inside)
            top = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:5]
            lines.append(f"{run['name']} round {run['round']} c={lv['concurrency']}: {lv['output_tokens_per_s'] or 0:.1f} tok/s, "
                         f"{lv['wall_s']:.1f} s, {len(inside)} cycles {spent:.1f} s, outside them {lv['wall_s'] - spent:.1f} s | "
                         + " ".join(f"{rows}{k} {len(v)}x{statistics.median(v) * 1000:.0f}ms" for (rows, k), v in top))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summary"] and len(argv) > 1:
        print("\n".join(summary(Path(p)) for p in argv[1:]))
        return 0
    if argv[:1] == ["--levels"] and len(argv) > 2 and all("=" in a for a in argv[2:]):
        print(levels(Path(argv[1]), {n: Path(p) for n, p in (a.split("=", 1) for a in argv[2:])}))
        return 0
    if len(argv) < 2 or argv[1] != "serve":
        print(__doc__, file=sys.stderr)
        return 2
    from blockdraft.cli import main as blockdraft_main

    record_cycles(Path(argv[0]))
    return blockdraft_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
