"""`blockdraft serve` with every decode cycle timed: a profiling wrapper for load sweeps (docs/serve.md).

    python scripts/serve_cycles.py OUT.json serve --port 8000 [serve options]
    python scripts/serve_cycles.py --summary OUT.json [OUT2.json ...]

The first form runs `blockdraft serve` with the arguments after OUT.json and, when the server stops, writes
one record per decode cycle: rows in the batch, rows that verified drafts, tokens committed, seconds, and
whether the rows were contiguous in the cache. Use it as a `serve_sweep` server command
(`--server 'dflash=.venv/bin/python scripts/serve_cycles.py /tmp/dflash-{port}.json serve --port {port}'`).
The second form prints, per file, each (rows, drafted) group's cycles, median seconds and tokens per second.
"""
from __future__ import annotations

import atexit
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from blockdraft.decoding.batch_engine import Batch
from blockdraft.files import atomic_path


def record_cycles(out: Path) -> None:
    """Wrap `Batch.cycle` to time each cycle; the records go to `out` when the process exits."""
    records: list[dict] = []
    cycle = Batch.cycle

    def timed(self: Batch, active: list[int] | None = None) -> dict[int, list[int]]:
        active = self.decoding_rows() if active is None else active
        states = [self.states[r] for r in active]
        before = [len(s.stats.sources) for s in states]
        start = time.perf_counter()
        committed = cycle(self, active)
        records.append({"rows": len(active), "seconds": time.perf_counter() - start,
                        "drafted": sum(len(s.stats.sources) > n for s, n in zip(states, before)),
                        "tokens": sum(map(len, committed.values())),
                        "contiguous": active == list(range(len(active)))})
        return committed

    def save() -> None:
        with atomic_path(out) as tmp:
            tmp.write_text(json.dumps(records))

    Batch.cycle = timed
    atexit.register(save)


def summary(path: Path) -> str:
    groups: dict[tuple[int, bool], list[dict]] = defaultdict(list)
    records = json.loads(path.read_text())
    for r in records:
        groups[(r["rows"], r["drafted"] > 0)].append(r)
    total = sum(r["seconds"] for r in records)
    lines = [f"{path}: {len(records)} cycles, {total:.1f} s, {sum(r['tokens'] for r in records)} tokens"]
    for (rows, drafted), group in sorted(groups.items()):
        seconds = sum(r["seconds"] for r in group)
        lines.append(f"  {rows:3d} rows {'drafting' if drafted else 'plain   '}: {len(group):5d} cycles, median "
                     f"{statistics.median(r['seconds'] for r in group) * 1000:6.1f} ms, "
                     f"{sum(r['tokens'] for r in group) / seconds:6.1f} tok/s")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summary"] and len(argv) > 1:
        print("\n".join(summary(Path(p)) for p in argv[1:]))
        return 0
    if len(argv) < 2 or argv[1] != "serve":
        print(__doc__, file=sys.stderr)
        return 2
    from blockdraft.cli import main as blockdraft_main

    record_cycles(Path(argv[0]))
    return blockdraft_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
