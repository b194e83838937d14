"""Server sweep against a small real streaming HTTP server started in-process (no model, sleeps per token)."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from blockdraft.bench.load_client import (RequestResult, api_root, percentile, server_sweep, server_table,
                                         summarize_level)
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.prompts import Prompt

TOKENS = 5  # completion tokens per request
DELAY = 0.005  # seconds per token: every request takes a while (latencies and TTFTs are never 0)


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.delay = DELAY  # seconds per token
        self.fail_every = 0  # every n-th chat request answers HTTP 500
        self.usage = True  # send the final usage chunk
        self.garbage = False  # send a non-JSON chunk
        self.interrupt = False  # close the stream with [DONE] but no finish_reason (llama-cpp-python style)
        self.count = 0
        self.seen: list[dict] = []
        self.lock = threading.Lock()
        self.open = self.peak = 0  # chat requests being answered now, and the most at once
        self.gate: threading.Barrier | None = None  # the first `gate.parties` chat requests wait for each other


class Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_error(404)
            return
        self._send_json({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.count += 1
            n = self.server.count
            self.server.seen.append(body)
            self.server.open += 1
            self.server.peak = max(self.server.peak, self.server.open)
        self.closed = False
        try:
            self._answer(body, n)
        finally:
            self._close()

    def _close(self) -> None:
        """No longer open: called before the last byte goes out, so the client cannot be sending its next
        request while this one still counts."""
        if not self.closed:
            self.closed = True
            with self.server.lock:
                self.server.open -= 1

    def _answer(self, body: dict, n: int) -> None:
        gate = self.server.gate
        if gate is not None and n <= gate.parties:
            try:
                gate.wait(timeout=60)  # a guard against a hang: fewer in flight never pass it
            except threading.BrokenBarrierError:
                self.send_error(500, "fewer requests in flight than the gate waits for")
                return
        if self.path != "/v1/chat/completions" or (self.server.fail_every and n % self.server.fail_every == 0):
            self.send_error(500, "boom")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        for i in range(TOKENS):
            time.sleep(self.server.delay)
            if self.server.garbage and i == 2:
                self.wfile.write(b"data: {not json\n\n")
                return
            if self.server.interrupt and i == 2:
                self.wfile.write(b"data: [DONE]\n\n")
                return
            self._event({"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]})
        self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if self.server.usage and body.get("stream_options", {}).get("include_usage"):
            self._event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS,
                                                  "total_tokens": TOKENS + 3}})
        self._close()
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _send_json(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url_of(srv: FakeServer, suffix: str = "") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{suffix}"


PROMPTS = [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},), source="test")
           for i in range(3)]


def sweep(srv: FakeServer, concurrencies: list[int], **kw) -> dict:
    kw.setdefault("requests_per_level", 8)
    return server_sweep(url_of(srv, "/v1/"), PROMPTS, concurrencies, model=None, max_tokens=TOKENS,
                        progress=False, warmup=0, **kw)


def test_sweep_counts_tokens_and_requests(server):
    result = sweep(server, [1, 4])
    assert result["model"] == "fake-model" and result["base_url"] == url_of(server)
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4]
    for lv in result["levels"]:
        assert lv["requests"] == lv["ok"] == 8 and lv["errors"] == 0
        assert lv["output_tokens"] == 8 * TOKENS and lv["mean_tokens_per_request"] == TOKENS
        assert lv["token_count"] == "usage"
        assert lv["latency_p50_s"] <= lv["latency_p95_s"] <= lv["latency_p99_s"]
        assert 0 < lv["ttft_p50_s"] <= lv["ttft_p95_s"] <= lv["latency_p99_s"]
    # the request body is a streamed chat completion, prompts sent in a fixed cycle
    body = server.seen[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake-model" and body["max_tokens"] == TOKENS and body["temperature"] == 0.0
    assert sorted(b["messages"][0]["content"] for b in server.seen[:8]) == sorted(
        f"question {i % 3}" for i in range(8))
    json.dumps(result)  # plain JSON


def test_default_request_count_and_chunk_fallback(server):
    server.usage = False
    lv = sweep(server, [2], requests_per_level=None)["levels"][0]
    assert lv["requests"] == max(2 * 2, len(PROMPTS)) and lv["output_tokens"] == 4 * TOKENS
    assert lv["token_count"] == "chunks"


def test_failed_requests_are_counted_not_raised(server):
    server.fail_every = 3
    lv = sweep(server, [2], requests_per_level=9)["levels"][0]
    assert lv["requests"] == 9 and lv["errors"] == 3 and lv["ok"] == 6
    assert lv["error_reasons"] == {"HTTP 500": 3} and lv["output_tokens"] == 6 * TOKENS


def test_malformed_stream_is_an_error(server):
    server.garbage = True
    lv = sweep(server, [1], requests_per_level=2)["levels"][0]
    assert lv["errors"] == 2 and lv["output_tokens"] == 0 and lv["latency_p50_s"] is None
    assert all(reason.startswith("malformed chunk") for reason in lv["error_reasons"])


def test_stream_cut_short_is_an_error(server):
    server.interrupt = True
    lv = sweep(server, [1], requests_per_level=2)["levels"][0]
    assert lv["errors"] == 2 and lv["output_tokens"] == 0
    assert list(lv["error_reasons"]) == ["stream ended without a finish_reason (interrupted)"]


def test_concurrency_c_keeps_c_requests_in_flight(server):
    """What makes throughput grow with concurrency on a server that is not compute-bound: c requests open at
    once, never more. At c = 4 the first 4 requests wait in the server until all 4 have arrived (with fewer
    in flight they would time out and fail); the server counts the most it ever had open. No clock involved."""
    one = sweep(server, [1], requests_per_level=6)["levels"][0]
    assert one["ok"] == 6 and server.peak == 1
    server.count = server.peak = 0
    server.gate = threading.Barrier(4)
    four = sweep(server, [4], requests_per_level=12)["levels"][0]
    assert four["ok"] == 12 and four["errors"] == 0 and server.peak == 4
    for lv in (one, four):  # the rates are the counts over the level's wall time
        assert lv["output_tokens_per_s"] == pytest.approx(lv["output_tokens"] / lv["wall_s"], rel=1e-3)
        assert lv["requests_per_s"] == pytest.approx(lv["ok"] / lv["wall_s"], rel=1e-3)


def test_a_level_s_rates_and_percentiles_come_from_its_requests():
    results = [RequestResult(True, latency=1.0 + i, ttft=0.1 * (i + 1), tokens=10, from_usage=True) for i in range(4)]
    level = summarize_level(2, [*results, RequestResult(False, 0.5, error="HTTP 500")], wall=4.0)
    assert level["requests"] == 5 and level["ok"] == 4 and level["errors"] == 1
    assert level["error_reasons"] == {"HTTP 500": 1} and level["output_tokens"] == 40
    assert level["output_tokens_per_s"] == 10.0 and level["requests_per_s"] == 1.0 and level["wall_s"] == 4.0
    assert level["latency_p50_s"] == 2.5 and level["ttft_p50_s"] == 0.25 and level["mean_tokens_per_request"] == 10
    assert level["token_count"] == "usage"


def test_dead_server_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BlockdraftError) as info:
        server_sweep(f"http://127.0.0.1:{port}", PROMPTS, [1], model="m", max_tokens=4, progress=False)
    message = str(info.value)
    assert "\n" not in message and f"http://127.0.0.1:{port}" in message


def test_argument_checks():
    assert api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1"
    with pytest.raises(InvalidArgumentError):
        api_root("localhost:8000")
    with pytest.raises(InvalidArgumentError):
        server_sweep("http://h:1", PROMPTS, [0], model="m", max_tokens=4)
    with pytest.raises(InvalidArgumentError):
        server_sweep("http://h:1", [], [1], model="m", max_tokens=4)


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(range(101), 95) == pytest.approx(95)


def level(c: int, tps: float | None, errors: int = 0) -> dict:
    return {"concurrency": c, "requests": 8, "errors": errors, "output_tokens_per_s": tps,
            "requests_per_s": 1.5, "latency_p50_s": 1.0, "latency_p95_s": 2.0, "latency_p99_s": 2.5,
            "ttft_p50_s": 0.1}


def test_server_table_rows_and_speedup():
    ours = {"levels": [level(1, 100.0), level(4, 300.0, errors=1)]}
    plain = {"levels": [level(1, 50.0)]}
    table = server_table(ours).splitlines()
    assert len(table) == 4 and "Speedup" not in table[0]
    assert table[2].startswith("| 1 | 100.0 |") and "0/8" in table[2] and "1/8" in table[3]
    table = server_table(ours, baseline=plain).splitlines()
    assert "Baseline (tok/s)" in table[0] and "Speedup" in table[0]
    assert "| 100.0 | 50.0 | 2.00× |" in table[2]
    assert "| 300.0 | – | – |" in table[3]  # no baseline at this concurrency
