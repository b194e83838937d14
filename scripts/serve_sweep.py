"""Load sweep of several OpenAI-compatible servers on one machine, in ABBA rounds (docs/serve.md).

    .venv/bin/python scripts/serve_sweep.py --server 'NAME=COMMAND {port}' [--server ...] --out OUT [flags]

    start every server (subprocesses, one after another, each once it answers: a first start measures the
    verify cost curves with the machine to itself), then for each round and concurrency: run that level
    closed-loop (`blockdraft.bench.load_client`) on each server in turn, the order alternating from level to
    level and round to round (ABBA per level: these machines' speed drifts by 20-30% over minutes, and a
    level takes about a minute, a whole server's sweep ten); stop them (SIGTERM)
    then (the concurrency-1 overhead of the server): the main server and Pipeline.stream called directly (a
    worker subprocess: the model on its main thread) both loaded, the same prompts sent to one then the other,
    request by request, the order alternating (ABBA), so machine drift hits both alike

Only one server has clients at a time, so they never share the cores (an idle one sleeps); all of them
hold their memory at once, which `--one-at-a-time` avoids (each round starts, sweeps and stops each
server in turn, the second round in reverse order). Per concurrency level, request i sends
prompt i mod P and max(c, P) requests are sent, so the c = 32 level is a 32-client burst of the same
prompts the c = 1 level sends alone: `identity` compares every greedy reply of every level with that
request alone on the same server, and with the reference server's (plain decoding: the target's own
greedy output). Writes sweep.json, sweep.md (a table like the paper's Table 3, with the spread over the
rounds) and throughput / p95-latency plots.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any, Callable

from tqdm import tqdm

from blockdraft.bench import servers
from blockdraft.bench.datasets import bench_prompts
from blockdraft.bench.load_client import api_root, chat_payload, resolve_model, send_request
from blockdraft.bench.provenance import commit_label
from blockdraft.bench.servers import ServerSpec
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)


def parse_server(text: str, default_concurrency: tuple[int, ...]) -> ServerSpec:
    """'NAME=COMMAND' or 'NAME@1,8=COMMAND' (its own concurrencies); COMMAND is split on spaces."""
    name, sep, command = text.partition("=")
    if not sep or not command.strip():
        raise InvalidArgumentError(f"--server {text!r}: expected NAME=COMMAND (with {{port}} in COMMAND)")
    name, _, levels = name.partition("@")
    concurrency = tuple(int(c) for c in levels.split(",")) if levels else default_concurrency
    if "{port}" not in command:
        raise InvalidArgumentError(f"--server {text!r}: expected {{port}} in the command")
    return ServerSpec(name.strip(), command.split(), concurrency)


def run_together(specs: list[ServerSpec], port: int, prompts: list[Prompt], max_tokens: int, rounds: int,
                 out: Path, progress: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Start every server (port 0: free ones; else port, port + 1, ...), then per round and concurrency run
    the level on each server that sweeps it, in `specs` order when round + level index is even, else reversed
    (so each level's rounds pair up ABBA); stop them. One run record per server and round, as `servers.run_server`
    makes; `progress(runs)` after every level. A server that stops answering (it crashed) is left out from
    then on, the others go on: its run record of that round says where ("down")."""
    levels = sorted({c for s in specs for c in s.concurrency})
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(servers.serving(s, port + i if port else 0, out / f"{s.name}.log"))
                for i, s in enumerate(specs)]
        turn, warm, down = list(zip(specs, urls)), set(), set()
        for r in range(rounds):
            current = {s.name: servers.run_record(s, [], r) for s in specs}
            runs += current.values()
            for i, c in enumerate(levels):
                for spec, url in turn if (r + i) % 2 == 0 else turn[::-1]:
                    if c not in spec.concurrency or spec.name in down:
                        continue
                    if servers.add_level(current[spec.name], url, prompts, c, max_tokens, warmup=spec.name not in warm):
                        warm.add(spec.name)
                    else:
                        down.add(spec.name)
                progress(runs)
    return runs


def direct_worker(prompts: list[Prompt], max_tokens: int, target: str | None) -> None:
    """The direct side of `overhead`: load the pipeline, warm it up, print "ready"; then for each prompt
    index read on stdin, Pipeline.stream that prompt and print its tokens, seconds and text (one JSON line)."""
    from blockdraft.api import Pipeline

    pipe = Pipeline.load() if target is None else Pipeline.load(target)
    pipe.generate(messages=list(prompts[0].messages), max_new_tokens=16, temperature=0.0)
    print("ready", flush=True)
    for line in sys.stdin:
        p = prompts[int(line)]
        start = time.perf_counter()
        stream = pipe.stream(messages=list(p.messages), max_new_tokens=max_tokens, temperature=0.0)
        text = "".join(stream)
        seconds = time.perf_counter() - start
        print(json.dumps({"tokens": len(stream.output.token_ids), "seconds": seconds, "text": text}), flush=True)


class _Direct:
    """The direct worker subprocess, asked one prompt at a time."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--direct-worker", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:  # the library logs to stderr; skip anything else a load prints
            if line.strip() == "ready":
                return
        self.close()
        raise BlockdraftError("the Pipeline.stream worker exited before it was ready (see its output above)")

    def run(self, index: int) -> dict[str, Any]:
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(60)


def overhead(spec: ServerSpec, port: int, prompts: list[Prompt], max_tokens: int, rounds: int,
             worker_args: list[str], log_path: Path) -> dict[str, Any]:
    """Concurrency 1 through `spec` against Pipeline.stream called directly: every round sends each prompt to
    both, one after the other, the order alternating from request to request (ABBA). Server tokens/s: a
    reply's completion tokens over its end-to-end seconds at the client (HTTP, JSON and SSE included);
    direct: over the seconds `Pipeline.stream` took. Also whether the two texts are the same."""
    direct = _Direct(worker_args)
    try:
        with servers.serving(spec, port, log_path) as url:
            root = api_root(url)
            model = resolve_model(root, None, None)
            endpoint, headers = f"{root}/v1/chat/completions", {"Content-Type": "application/json"}
            send_request(endpoint, chat_payload(prompts[0], model, 16, 0.0), headers, 600)  # warm-up
            pairs = []
            bar = tqdm(total=rounds * len(prompts), desc="concurrency-1 overhead", unit="pair", dynamic_ncols=True)
            for r in range(rounds):
                for i, p in enumerate(prompts):
                    payload = chat_payload(p, model, max_tokens, 0.0)
                    if (r + i) % 2 == 0:
                        reply, alone = send_request(endpoint, payload, headers, 600), direct.run(i)
                    else:
                        alone = direct.run(i)
                        reply = send_request(endpoint, payload, headers, 600)
                    pairs.append({"round": r, "prompt": i, "server_ok": reply.ok, "server_tokens": reply.tokens,
                                  "server_s": round(reply.latency, 4), "direct_tokens": alone["tokens"],
                                  "direct_s": round(alone["seconds"], 4),
                                  "same_text": reply.ok and reply.text == alone["text"]})
                    bar.update()
            bar.close()
    finally:
        direct.close()
    return summarize_overhead(pairs, spec.name)


def summarize_overhead(pairs: list[dict[str, Any]], server: str) -> dict[str, Any]:
    """Tokens/s of both sides over all pairs whose server reply succeeded, their ratio, and per round."""
    def rate(rows: list[dict[str, Any]], side: str) -> float:
        seconds = sum(x[f"{side}_s"] for x in rows)
        return sum(x[f"{side}_tokens"] for x in rows) / seconds if seconds else 0.0

    ok = [x for x in pairs if x["server_ok"]]
    per_round = []
    for r in sorted({x["round"] for x in ok}):
        rows = [x for x in ok if x["round"] == r]
        if rate(rows, "direct"):
            per_round.append(round(rate(rows, "server") / rate(rows, "direct"), 4))
    server_rate, direct_rate = rate(ok, "server"), rate(ok, "direct")
    return {"server": server, "server_tokens_per_s": round(server_rate, 3),
            "direct_tokens_per_s": round(direct_rate, 3),
            "ratio": round(server_rate / direct_rate, 4) if direct_rate else None, "round_ratios": per_round,
            "errors": len(pairs) - len(ok), "same_text": sum(x["same_text"] for x in pairs), "pairs": pairs}


# ---------------------------------------------------------------------- summary
def _by_level(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {lv["concurrency"]: lv for lv in run["levels"]}


def identity(runs: list[dict[str, Any]], reference: str | None, prompts: int) -> dict[str, Any]:
    """Per server: greedy replies equal to the same request alone (its c = 1 level), and to `reference`'s."""
    solo_ref = {}
    if reference is not None:
        ref_runs = [r for r in runs if r["name"] == reference and r["levels"]]
        solo_ref = dict(enumerate(_by_level(ref_runs[0])[min(_by_level(ref_runs[0]))]["texts"])) if ref_runs else {}
    report: dict[str, Any] = {}
    for run in (r for r in runs if r["levels"]):  # a server's run has no level yet early in a round
        levels = _by_level(run)
        solo = levels[min(levels)]["texts"]
        same = total = same_ref = total_ref = 0
        for lv in levels.values():
            for i, text in enumerate(lv["texts"]):
                if text is None or solo[i % prompts] is None:
                    continue
                total += 1
                same += text == solo[i % prompts]
                if solo_ref.get(i % prompts) is not None:
                    total_ref += 1
                    same_ref += text == solo_ref[i % prompts]
        entry = report.setdefault(run["name"], {"same_as_alone": 0, "replies": 0, "same_as_reference": 0,
                                                "compared_with_reference": 0})
        entry["same_as_alone"] += same
        entry["replies"] += total
        entry["same_as_reference"] += same_ref
        entry["compared_with_reference"] += total_ref
    return report


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per server and concurrency: the mean over rounds of throughput, requests/s, latencies, TTFT; the
    rounds' own throughputs; errors summed."""
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for run in runs:
        for c, lv in _by_level(run).items():
            table.setdefault(run["name"], {}).setdefault(c, {"rounds": []})["rounds"].append(lv)
    for levels in table.values():
        for cell in levels.values():
            rounds = cell.pop("rounds")
            for key in ("output_tokens_per_s", "requests_per_s", "latency_p50_s", "latency_p95_s", "ttft_p50_s",
                        "ttft_p95_s"):
                values = [r[key] for r in rounds if r[key] is not None]
                cell[key] = round(mean(values), 4) if values else None
            cell["throughput_rounds"] = [r["output_tokens_per_s"] for r in rounds]
            cell["errors"] = sum(r["errors"] for r in rounds)
            cell["requests"] = sum(r["requests"] for r in rounds)
    return table


def _ratio_cells(table: dict, name: str, other: str, c: int) -> str:
    """'1.23x (1.20-1.26)': the mean ratio, and the range of the per-round ratios (ABBA pairs)."""
    a, b = table.get(name, {}).get(c), table.get(other, {}).get(c)
    if not a or not b or not b["output_tokens_per_s"]:
        return "–"
    ratio = a["output_tokens_per_s"] / b["output_tokens_per_s"]
    pairs = [x / y for x, y in zip(a["throughput_rounds"], b["throughput_rounds"]) if x and y]
    spread = f" ({min(pairs):.2f}-{max(pairs):.2f})" if len(pairs) > 1 else ""
    return f"{ratio:.2f}x{spread}"


def markdown(result: dict[str, Any]) -> str:
    table, main, baselines = result["summary"], result["main"], result["baselines"]
    names = list(table)
    lines = [f"Closed-loop clients, {result['prompts']} {result.get('dataset', 'mt-bench')} first turns, {result['max_tokens']} max tokens, "
             f"T=0, {result['rounds']} rounds ({_order(result)}); mean over rounds, (min-max) of the per-round ratios.",
             ""]
    if result.get("environment"):  # which CPU decides much of it (serve-v7 against serve-v8)
        lines += [machine_line(result["environment"]), ""]
    head = ["c"] + [f"{n} tok/s" for n in names] + [f"{main} x {b}" for b in baselines]
    head += [f"{main} req/s", f"{main} TTFT p50/p95 (s)", f"{main} latency p50/p95 (s)", "errors"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for c in sorted({c for levels in table.values() for c in levels}):
        m = table.get(main, {}).get(c)
        cells = [str(c)] + [_fmt(table[n].get(c, {}).get("output_tokens_per_s"), 1) for n in names]
        cells += [_ratio_cells(table, main, b, c) for b in baselines]
        if m:
            cells += [_fmt(m["requests_per_s"], 3), f"{_fmt(m['ttft_p50_s'], 2)} / {_fmt(m['ttft_p95_s'], 2)}",
                      f"{_fmt(m['latency_p50_s'], 2)} / {_fmt(m['latency_p95_s'], 2)}"]
        else:
            cells += ["–"] * 3
        cells.append(", ".join(f"{n} {table[n][c]['errors']}/{table[n][c]['requests']}" for n in names if c in table[n]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| server | c | tok/s per round | req/s | TTFT p50 / p95 (s) | latency p50 / p95 (s) |",
              "|---|---:|---|---:|---|---|"]
    for n in names:
        for c, cell in sorted(table[n].items()):
            lines.append(f"| {n} | {c} | {' / '.join(_fmt(x, 1) for x in cell['throughput_rounds'])} | "
                         f"{_fmt(cell['requests_per_s'], 3)} | {_fmt(cell['ttft_p50_s'], 2)} / "
                         f"{_fmt(cell['ttft_p95_s'], 2)} | {_fmt(cell['latency_p50_s'], 2)} / "
                         f"{_fmt(cell['latency_p95_s'], 2)} |")
    for run in (r for r in result.get("runs", []) if r.get("down")):
        lines += ["", f"{run['name']} stopped answering ({run['down']}): its later levels did not run; see its log, "
                      f"{run['name']}.log."]
    if result.get("overhead"):
        lines += ["", overhead_line(result["overhead"])]
    lines += ["", "Greedy replies identical to the same request alone / to the reference server's: "
              + "; ".join(f"{n} {v['same_as_alone']}/{v['replies']} alone, {v['same_as_reference']}/"
                          f"{v['compared_with_reference']} reference" for n, v in result["identity"].items())]
    return "\n".join(lines) + "\n"


def machine_line(env: dict[str, Any]) -> str:
    """'Machine: <CPU> (<its widest vector ISA torch uses>), N cores, torch X, blockdraft at <commit>.'"""
    commit = env.get("git_commit")
    return (f"Machine: {env.get('cpu_model') or 'unknown CPU'} ({env.get('cpu_capability', '?')}), "
            f"{env.get('cpu_count', '?')} cores, torch {env.get('packages', {}).get('torch', '?')}"
            + (f", blockdraft at {commit_label([env])}." if commit else "."))


def _order(result: dict[str, Any]) -> str:
    if result.get("together", False):
        return "servers up together, each level's order alternating: ABBA per level"
    return "one server at a time, the order alternating: ABBA per round"


def overhead_line(o: dict[str, Any]) -> str:
    rounds = o["round_ratios"]
    spread = f" (per round {min(rounds):.1%}-{max(rounds):.1%})" if len(rounds) > 1 else ""
    ratio = "–" if o["ratio"] is None else f"{o['ratio']:.1%}"
    return (f"Concurrency 1, {o['server']} through HTTP vs Pipeline.stream called directly, request by request "
            f"in ABBA order over {len(rounds)} rounds: {o['server_tokens_per_s']:.1f} vs "
            f"{o['direct_tokens_per_s']:.1f} tok/s = {ratio}{spread}; {o['same_text']}/{len(o['pairs'])} "
            f"texts identical, {o['errors']} errors.")


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def plot(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label, name in (("output_tokens_per_s", "output tokens / s (all clients)", "throughput.png"),
                             ("latency_p95_s", "p95 latency of a completed reply (s)", "latency_p95.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for server, levels in result["summary"].items():
            cs = sorted(levels)
            ax.plot(cs, [levels[c][key] for c in cs], marker="o", label=server)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------- command
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/serve_sweep.py", description=__doc__.split("\n")[0])
    p.add_argument("--server", action="append", default=[], metavar="NAME[@C,..]=COMMAND",
                   help="a server to start and sweep ({port} in COMMAND); repeat; the first is the main one")
    p.add_argument("--baseline", action="append", default=[], help="server names to compare the main one with")
    p.add_argument("--reference", default=None, help="server whose c=1 greedy replies are the target's own")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="default concurrencies (default 1,2,4,8,16,32)")
    p.add_argument("--dataset", default="mt-bench", help="prompts: a bench dataset or a JSONL file (default mt-bench)")
    p.add_argument("--samples", type=int, default=8, help="first turns of it (default 8)")
    p.add_argument("--max-tokens", type=int, default=256, help="max tokens per reply (default 256)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds; each level's order of servers alternates from round to round (default 2)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="start, sweep and stop each server in turn (less memory; drift between servers' sweeps "
                        "then shows up in the ratios) instead of keeping them all up and alternating per level")
    p.add_argument("--port", type=int, default=8123,
                   help="port of the first server, the next ones count up (default 8123; 0: free ones)")
    p.add_argument("--overhead-rounds", type=int, default=2,
                   help="rounds of the concurrency-1 comparison of the main server with Pipeline.stream called "
                        "directly, request by request (default 2; 0 skips it)")
    p.add_argument("--direct-target", default=None,
                   help="target Pipeline.stream loads for that comparison (default: the default pair)")
    p.add_argument("--out", default="serve-sweep", help="output folder (default serve-sweep)")
    p.add_argument("--direct-worker", action="store_true", help=argparse.SUPPRESS)  # internal: the direct side
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.overhead_rounds < 0:
        raise InvalidArgumentError(f"--overhead-rounds {args.overhead_rounds}: expected an integer >= 0")
    prompts = bench_prompts(args.dataset, args.samples, 0)
    if args.direct_worker:
        direct_worker(prompts, args.max_tokens, args.direct_target)
        return 0
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    specs = [parse_server(s, concurrency) for s in args.server]
    if not specs:
        raise InvalidArgumentError("no --server given: expected at least one NAME=COMMAND")
    if len({s.name for s in specs}) < len(specs):
        raise InvalidArgumentError(f"--server names {[s.name for s in specs]}: expected each name once")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    if args.one_at_a_time:
        for r in range(args.rounds):
            for spec in specs if r % 2 == 0 else specs[::-1]:
                runs.append(servers.run_server(spec, args.port, prompts, args.max_tokens, out / f"{spec.name}.log", r))
                _save(out, args, runs, None, specs, len(prompts))
    else:
        runs = run_together(specs, args.port, prompts, args.max_tokens, args.rounds, out,
                            lambda so_far: _save(out, args, so_far, None, specs, len(prompts)))
    over = None
    if args.overhead_rounds:
        worker = ["--dataset", args.dataset, "--samples", str(args.samples), "--max-tokens", str(args.max_tokens)]
        worker += ["--direct-target", args.direct_target] if args.direct_target else []
        over = overhead(specs[0], args.port, prompts, args.max_tokens, args.overhead_rounds, worker,
                        out / f"{specs[0].name}.log")
    result = _save(out, args, runs, over, specs, len(prompts))
    plot(result, out)
    print(markdown(result))
    return 0


def _save(out: Path, args: argparse.Namespace, runs: list, over: dict[str, Any] | None, specs: list[ServerSpec],
          prompts: int) -> dict[str, Any]:
    """Write sweep.json and sweep.md with what has run so far (a killed sweep keeps its finished servers)."""
    from blockdraft.bench.report import environment
    import torch

    result = {"schema": "blockdraft.bench.serve_sweep/1", "environment": environment(torch.device("cpu"), torch.float32),
              "dataset": args.dataset, "prompts": prompts, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "together": not args.one_at_a_time,
              "main": specs[0].name, "baselines": args.baseline, "reference": args.reference,
              "servers": {s.name: " ".join(s.command) for s in specs}, "summary": summarize(runs),
              "identity": identity(runs, args.reference, prompts), "overhead": over, "runs": runs,
              }
    with atomic_path(out / "sweep.json") as tmp:
        tmp.write_text(json.dumps(result, indent=1, default=str))
    with atomic_path(out / "sweep.md") as tmp:
        tmp.write_text(markdown(result))
    return result


if __name__ == "__main__":
    sys.exit(main())
