"""Servers under test as subprocesses: a run record per sweep, and a server that stops answering ends it."""
from __future__ import annotations

import contextlib

import pytest

from blockdraft.bench import servers
from blockdraft.bench.servers import ServerSpec
from blockdraft.errors import BlockdraftError, InvalidArgumentError


def level(c: int) -> dict:
    return {"concurrency": c, "output_tokens_per_s": 10.0, "errors": 0, "requests": max(c, 2), "texts": ["x"] * max(c, 2)}


def fake_servers(monkeypatch, run_level) -> list[tuple[str, int]]:
    """Servers that need no process: a server's URL is its name, and `run_level` plays its levels."""
    started = []

    @contextlib.contextmanager
    def serving(spec, port, log_path):
        started.append((spec.name, port))
        yield spec.name

    monkeypatch.setattr(servers, "serving", serving)
    monkeypatch.setattr(servers, "run_level", run_level)
    return started


def test_a_sweep_is_one_run_record_with_the_port_masked(monkeypatch, tmp_path):
    warmups = []

    def run_level(url, prompts, c, max_tokens, warmup):
        warmups.append(warmup)
        return level(c)

    started = fake_servers(monkeypatch, run_level)
    spec = ServerSpec("a", ["serve", "--port", "{port}"], (1, 4))
    record = servers.run_server(spec, 0, ["p", "q"], 8, tmp_path / "a.log", 1)
    assert started == [("a", 0)] and warmups == [True, False]  # only the first level warms the server up
    assert record["name"] == "a" and record["round"] == 1 and record["command"] == ["serve", "--port", "PORT"]
    assert [lv["concurrency"] for lv in record["levels"]] == [1, 4] and "down" not in record


def test_a_server_that_goes_down_ends_its_sweep_there(monkeypatch, tmp_path):
    def run_level(url, prompts, c, max_tokens, warmup):
        if c == 4:
            raise BlockdraftError("no OpenAI-compatible server reachable at http://127.0.0.1:9 (refused)")
        return level(c)

    fake_servers(monkeypatch, run_level)
    record = servers.run_server(ServerSpec("a", ["serve", "{port}"], (1, 4, 8)), 0, ["p", "q"], 8,
                                tmp_path / "a.log", 1)
    assert [lv["concurrency"] for lv in record["levels"]] == [1]
    assert record["down"].startswith("round 2, 4 clients: no OpenAI-compatible server")


def test_a_bad_sweep_argument_raises_instead_of_marking_the_server_down(monkeypatch, tmp_path):
    def run_level(url, prompts, c, max_tokens, warmup):
        raise InvalidArgumentError("max_tokens 0: expected >= 1")

    fake_servers(monkeypatch, run_level)
    with pytest.raises(InvalidArgumentError, match="max_tokens 0"):
        servers.run_server(ServerSpec("a", ["serve", "{port}"], (1,)), 0, ["p"], 0, tmp_path / "a.log")


def test_a_server_that_exits_before_answering_is_an_error(tmp_path):
    spec = ServerSpec("gone", ["false", "{port}"], (1,))
    with pytest.raises(BlockdraftError, match="exited with code 1 before answering"):
        with servers.serving(spec, 0, tmp_path / "gone.log"):
            pass
