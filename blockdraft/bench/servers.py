"""Servers under test as subprocesses: start an OpenAI-compatible server, sweep its concurrency levels, stop it.

A `ServerSpec` names a server, the command that starts it ("{port}" in it is replaced by the port) and the
concurrencies it is swept at. `serving` starts one and waits until it answers; `run_server` sweeps its levels
closed-loop (`blockdraft.bench.load_client`) into a run record:

    {"name", "command" (the port written PORT), "round", "levels": [one level per concurrency, each with
     its reply texts and "started": when its requests began, epoch seconds], "down": where it stopped
     answering (only if it did)}

A server that stops answering mid-sweep ends its sweep there; a bad sweep argument raises.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from blockdraft.bench.load_client import server_sweep
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)

START_TIMEOUT_S = 900  # a first start measures the verify cost curves (cached afterwards)


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: list[str]  # "{port}" is replaced by the port
    concurrency: tuple[int, ...]


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(spec: ServerSpec, port: int, log_path: Path) -> Iterator[str]:
    """Start `spec` (port 0: a free one), wait until it answers, yield its URL; stop it (SIGTERM) after."""
    port = port or free_port()
    command = [part.replace("{port}", str(port)) for part in spec.command]
    url = f"http://127.0.0.1:{port}"
    log.info("%s: %s", spec.name, " ".join(command))
    with open(log_path, "a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_ready(url, proc, START_TIMEOUT_S)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_level(url: str, prompts: list[Prompt], c: int, max_tokens: int, warmup: bool) -> dict[str, Any]:
    """One closed-loop level of `c` clients (max(c, P) requests, each text kept) against the server at `url`;
    `started`: when its requests began (epoch seconds, to line it up with a server's own records)."""
    level = server_sweep(url, prompts, [c], model=None, max_tokens=max_tokens, temperature=0.0,
                         requests_per_level=max(c, len(prompts)), warmup=1 if warmup else 0, texts=True)["levels"][0]
    return level | {"started": round(time.time() - level["wall_s"], 3)}  # the warm-up is not in wall_s


def run_record(spec: ServerSpec, levels: list[dict[str, Any]], round_: int) -> dict[str, Any]:
    return {"name": spec.name, "command": [p.replace("{port}", "PORT") for p in spec.command], "levels": levels,
            "round": round_}


def add_level(record: dict[str, Any], url: str, prompts: list[Prompt], c: int, max_tokens: int,
              warmup: bool) -> bool:
    """Run level `c` into the run record; False when the server no longer answers (it crashed): the record then
    says where ("down") and its server's other levels should be skipped."""
    try:
        level = run_level(url, prompts, c, max_tokens, warmup)
    except InvalidArgumentError:  # the sweep's own arguments: no server would do better
        raise
    except BlockdraftError as exc:
        record["down"] = f"round {record['round'] + 1}, {c} clients: {exc}"
        log.warning("%s is down (%s): its other levels are skipped; see %s.log", record["name"], exc, record["name"])
        return False
    record["levels"].append(level)
    return True


def run_server(spec: ServerSpec, port: int, prompts: list[Prompt], max_tokens: int, log_path: Path, round_: int = 0,
               ) -> dict[str, Any]:
    """Start `spec`, sweep its concurrencies, stop it; the sweep's levels (each with its texts). Port 0: a free one.
    A server that stops answering ends its sweep there (`add_level`)."""
    record = run_record(spec, [], round_)
    with serving(spec, port, log_path) as url:
        for i, c in enumerate(spec.concurrency):
            if not add_level(record, url, prompts, c, max_tokens, warmup=i == 0):
                break
    return record
