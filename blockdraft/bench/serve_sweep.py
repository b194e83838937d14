"""Load sweep of several OpenAI-compatible servers on one machine, in ABBA rounds (docs/serve.md).

    for each round (the second in reverse order): for each server: start it (a subprocess), wait until it
    answers, sweep the concurrencies closed-loop (`blockdraft.bench.load_client`), stop it (SIGTERM)
    then: Pipeline.stream called directly on the same prompts (a subprocess: the model on its main thread),
    once per round, for the concurrency-1 overhead of the server

Servers run one at a time, so they never share the two cores. Per concurrency level, request i sends
prompt i mod P and max(c, P) requests are sent, so the c = 32 level is a 32-client burst of the same
prompts the c = 1 level sends alone: `identity` compares every greedy reply of every level with that
request alone on the same server, and with the reference server's (plain decoding: the target's own
greedy output). Writes sweep.json, sweep.md (a table like the paper's Table 3, with the spread over the
rounds) and throughput / p95-latency plots.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from blockdraft.bench.datasets import bench_prompts
from blockdraft.bench.load_client import server_sweep
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.files import atomic_path
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 900  # a first start measures the verify cost curves (cached afterwards)


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: list[str]  # "{port}" is replaced by the port
    concurrency: tuple[int, ...]


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


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BlockdraftError(f"server exited with code {proc.returncode} before answering (see its log)")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise BlockdraftError(f"server at {url} did not answer within {timeout:.0f} s")


def run_server(spec: ServerSpec, port: int, prompts: list[Prompt], max_tokens: int, log_path: Path,
               ) -> dict[str, Any]:
    """Start `spec`, sweep its concurrencies, stop it; the sweep's levels (each with its texts). Port 0: a free one."""
    port = port or _free_port()
    command = [part.replace("{port}", str(port)) for part in spec.command]
    url = f"http://127.0.0.1:{port}"
    log.info("%s: %s", spec.name, " ".join(command))
    with open(log_path, "a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_ready(url, proc, _START_TIMEOUT_S)
            levels = []
            for i, c in enumerate(spec.concurrency):
                sweep = server_sweep(url, prompts, [c], model=None, max_tokens=max_tokens, temperature=0.0,
                                     requests_per_level=max(c, len(prompts)), warmup=1 if i == 0 else 0,
                                     texts=True)
                levels += sweep["levels"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {"name": spec.name, "command": command, "levels": levels}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def direct_stream(prompts: list[Prompt], max_tokens: int, options: dict[str, Any]) -> dict[str, Any]:
    """Pipeline.stream on each prompt in turn, timed end to end (one warm-up first): the server's c = 1 bound."""
    from blockdraft.api import Pipeline

    pipe = Pipeline.load()
    pipe.generate(messages=list(prompts[0].messages), max_new_tokens=16, **options)
    tokens, texts = 0, []
    start = time.perf_counter()
    for p in prompts:
        stream = pipe.stream(messages=list(p.messages), max_new_tokens=max_tokens, **options)
        texts.append("".join(stream))
        tokens += len(stream.output.token_ids)
    wall = time.perf_counter() - start
    return {"output_tokens": tokens, "wall_s": round(wall, 4), "output_tokens_per_s": round(tokens / wall, 3),
            "texts": texts}


def _direct_subprocess(prompts_arg: list[str], max_tokens: int, out: Path) -> dict[str, Any]:
    path = out / "direct.tmp.json"
    subprocess.run([sys.executable, "-m", "blockdraft.bench.serve_sweep", "--direct", str(path),
                    "--max-tokens", str(max_tokens), *prompts_arg], check=True)
    result = json.loads(path.read_text())
    path.unlink()
    return result


# ---------------------------------------------------------------------- summary
def _by_level(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {lv["concurrency"]: lv for lv in run["levels"]}


def identity(runs: list[dict[str, Any]], reference: str | None, prompts: int) -> dict[str, Any]:
    """Per server: greedy replies equal to the same request alone (its c = 1 level), and to `reference`'s."""
    solo_ref = {}
    if reference is not None:
        ref_runs = [r for r in runs if r["name"] == reference]
        solo_ref = dict(enumerate(_by_level(ref_runs[0])[min(_by_level(ref_runs[0]))]["texts"])) if ref_runs else {}
    report: dict[str, Any] = {}
    for run in runs:
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
             f"T=0, {result['rounds']} rounds (ABBA); mean over rounds, (min-max) of the per-round ratios.", ""]
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
    if result.get("direct"):
        d = [r["output_tokens_per_s"] for r in result["direct"]]
        lines += ["", f"Pipeline.stream called directly, same prompts one after another: "
                      f"{' / '.join(f'{x:.1f}' for x in d)} tok/s per round."]
    lines += ["", "Greedy replies identical to the same request alone / to the reference server's: "
              + "; ".join(f"{n} {v['same_as_alone']}/{v['replies']} alone, {v['same_as_reference']}/"
                          f"{v['compared_with_reference']} reference" for n, v in result["identity"].items())]
    return "\n".join(lines) + "\n"


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
    p = argparse.ArgumentParser(prog="python -m blockdraft.bench.serve_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--server", action="append", default=[], metavar="NAME[@C,..]=COMMAND",
                   help="a server to start and sweep ({port} in COMMAND); repeat; the first is the main one")
    p.add_argument("--baseline", action="append", default=[], help="server names to compare the main one with")
    p.add_argument("--reference", default=None, help="server whose c=1 greedy replies are the target's own")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="default concurrencies (default 1,2,4,8,16,32)")
    p.add_argument("--dataset", default="mt-bench", help="prompts: a bench dataset or a JSONL file (default mt-bench)")
    p.add_argument("--samples", type=int, default=8, help="first turns of it (default 8)")
    p.add_argument("--max-tokens", type=int, default=256, help="max tokens per reply (default 256)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; even rounds run the servers in reverse (default 2)")
    p.add_argument("--port", type=int, default=8123, help="port the servers listen on (default 8123; 0: a free one each time)")
    p.add_argument("--no-direct", action="store_true", help="skip timing Pipeline.stream directly")
    p.add_argument("--out", default="serve-sweep", help="output folder (default serve-sweep)")
    p.add_argument("--direct", default=None, help=argparse.SUPPRESS)  # internal: the direct-stream subprocess
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = build_parser().parse_args(argv)
    prompts = bench_prompts(args.dataset, args.samples, 0)
    if args.direct:
        result = direct_stream(prompts, args.max_tokens, {})
        Path(args.direct).write_text(json.dumps(result))
        return 0
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    specs = [parse_server(s, concurrency) for s in args.server]
    if not specs:
        raise InvalidArgumentError("no --server given: expected at least one NAME=COMMAND")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, direct = [], []
    for r in range(args.rounds):
        order = specs if r % 2 == 0 else specs[::-1]
        if not args.no_direct and r % 2 == 1:
            direct.append(_direct_subprocess(["--dataset", args.dataset, "--samples", str(args.samples)],
                                             args.max_tokens, out))
        for spec in order:
            runs.append(run_server(spec, args.port, prompts, args.max_tokens, out / f"{spec.name}.log") | {"round": r})
            _save(out, args, runs, direct, specs, len(prompts))
        if not args.no_direct and r % 2 == 0:
            direct.append(_direct_subprocess(["--dataset", args.dataset, "--samples", str(args.samples)],
                                             args.max_tokens, out))
    result = _save(out, args, runs, direct, specs, len(prompts))
    plot(result, out)
    print(markdown(result))
    return 0


def _save(out: Path, args: argparse.Namespace, runs: list, direct: list, specs: list[ServerSpec],
          prompts: int) -> dict[str, Any]:
    """Write sweep.json and sweep.md with what has run so far (a killed sweep keeps its finished servers)."""
    from blockdraft.bench.report import environment
    import torch

    result = {"schema": "blockdraft.bench.serve_sweep/1", "environment": environment(torch.device("cpu"), torch.float32),
              "dataset": args.dataset, "prompts": prompts, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "main": specs[0].name, "baselines": args.baseline, "reference": args.reference,
              "servers": {s.name: " ".join(s.command) for s in specs}, "summary": summarize(runs),
              "identity": identity(runs, args.reference, prompts), "direct": direct, "runs": runs,
              }
    with atomic_path(out / "sweep.json") as tmp:
        tmp.write_text(json.dumps(result, indent=1, default=str))
    with atomic_path(out / "sweep.md") as tmp:
        tmp.write_text(markdown(result))
    return result


if __name__ == "__main__":
    sys.exit(main())
