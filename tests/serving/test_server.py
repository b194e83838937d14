"""The OpenAI-compatible server over real HTTP (port 0, uvicorn and the scheduler on background threads), on tiny
random models: answers equal `Pipeline.generate`, the official `openai` client, concurrency, disconnects, the
queue, draining, metrics, bad input, the load client and the CLI."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blockdraft.bench.load_client import server_sweep
from blockdraft.cli import main
from blockdraft.errors import InvalidArgumentError
from blockdraft.prompts import Prompt
from blockdraft.serving import server as server_module
from blockdraft.serving.server import BlockdraftServer
from tests.conftest import tiny_pipeline

# tiny models driven from several threads: a second intra-op thread only adds waiting
pytestmark = pytest.mark.usefixtures("one_thread")

HI = [{"role": "user", "content": "hi"}]
LONG = "The quick brown fox jumps over the lazy dog. "
HELD = "hello world"  # its greedy answer runs past 400 tokens (no stop token)


def start(**kw: Any) -> BlockdraftServer:
    """A fresh server on its own pipeline (two servers never share a model)."""
    return BlockdraftServer(tiny_pipeline("qwen3", seed=2, fast=True), ("127.0.0.1", 0), model_id="tiny",
                            **kw).start()


@pytest.fixture(scope="module")
def server() -> Iterator[BlockdraftServer]:
    srv = start(max_batch=4, max_body_bytes=8192)
    yield srv
    srv.shutdown(timeout=5)


@pytest.fixture(scope="module")
def ref():
    """The same tiny pair as the servers' (same seeds: same weights), driven here directly, on this thread."""
    return tiny_pipeline("qwen3", seed=2, fast=True)


def client(srv: BlockdraftServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=60)


def request(srv: BlockdraftServer, path: str, body: Any = None, *, raw: bytes | None = None,
            method: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """(status, decoded JSON body, headers) of one request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.load(response), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), exc.headers


def call(srv: BlockdraftServer, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    status, out, _ = request(srv, path, body, **kw)
    return status, out


def events(srv: BlockdraftServer, path: str, body: dict) -> list[Any]:
    """The `data:` payloads of a streamed answer, JSON-decoded except the final "[DONE]"."""
    req = urllib.request.Request(srv.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in response]
    data = [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def streamed_text(chunks: list[Any]) -> str:
    parts = []
    for c in chunks:
        if c == "[DONE]" or not c.get("choices"):
            continue
        choice = c["choices"][0]
        parts.append(choice["delta"].get("content", "") if "delta" in choice else choice["text"])
    return "".join(parts)


def usage_of(ref, out, **source) -> dict[str, int]:
    prompt = len(ref.encode(**source))
    return {"prompt_tokens": prompt, "completion_tokens": len(out.token_ids),
            "total_tokens": prompt + len(out.token_ids)}


def healthy(srv: BlockdraftServer) -> dict:
    status, body = call(srv, "/health")
    assert status == 200 and body["status"] == "ok", body
    return body


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0) -> bool:
    """Poll until `predicate()` holds; False after `timeout` seconds (a guard against hanging, not a time limit
    on the behaviour: it returns as soon as the predicate holds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def hold_decoding(monkeypatch, srv: BlockdraftServer) -> threading.Event:
    """Until the returned event is set, the scheduler decodes nothing: its steps still admit, prefill (a
    stream's first token), drop cancelled requests, expire late ones and stop, but no row runs a cycle, so a
    running request cannot finish before the test lets it, however slow the machine."""
    release = threading.Event()
    decoding_rows = srv.scheduler.batch.decoding_rows
    monkeypatch.setattr(srv.scheduler.batch, "decoding_rows", lambda: decoding_rows() if release.is_set() else [])
    return release


class DrainClock:
    """The clock of `blockdraft.serving.server` (its `time` module) with a `monotonic` that moves only when the
    test calls `advance`: a drain runs out of time exactly when the test says, never because the machine is
    slow. `reads` counts the drain's looks at it."""

    sleep, time, perf_counter = staticmethod(time.sleep), staticmethod(time.time), staticmethod(time.perf_counter)

    def __init__(self, monkeypatch) -> None:
        self.now, self.reads = 1000.0, 0
        monkeypatch.setattr(server_module, "time", self)

    def monotonic(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def stop(srv: BlockdraftServer) -> None:
    """Clean up after a test whatever its state (a drain that never ends included): stop the scheduler, close."""
    srv.scheduler.stop()
    srv.shutdown(timeout=0)


def open_request(srv: BlockdraftServer, path: str, body: dict) -> http.client.HTTPConnection:
    """Send a request on a raw connection and return it unread."""
    address = urllib.parse.urlsplit(srv.url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn


class StreamReader(threading.Thread):
    """Reads one streamed request to its end on a thread of its own."""

    def __init__(self, srv: BlockdraftServer, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.conn = open_request(srv, path, {**body, "stream": True})
        self.status: int | None = None
        self.data: list[Any] = []
        self.start()

    def run(self) -> None:
        response = self.conn.getresponse()
        self.status = response.status
        if response.status != 200:
            self.data.append(json.load(response))
            return
        for line in response:
            if line.startswith(b"data: "):
                payload = line[len(b"data: "):].strip().decode()
                self.data.append(payload if payload == "[DONE]" else json.loads(payload))


def scrape(srv: BlockdraftServer) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client: {(name, sorted labels): value}."""
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# ---------------------------------------------------------------------- answers
@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_chat_equals_pipeline_generate(server, ref, limit):
    expected = ref.generate(messages=HI, max_new_tokens=24, temperature=0.0)
    status, body = call(server, "/v1/chat/completions",
                        {"model": "tiny", "messages": HI, limit: 24, "temperature": 0})
    assert status == 200 and body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["id"].startswith("chatcmpl-")
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected.text}
    assert choice["finish_reason"] == expected.finish_reason
    assert body["usage"] == usage_of(ref, expected, messages=HI)
    assert body["blockdraft"]["tokens_per_second"] > 0 and body["blockdraft"]["queue_seconds"] >= 0


def test_completion_equals_pipeline_generate(server, ref):
    expected = ref.generate("Once upon a time", max_new_tokens=20, temperature=0.0)
    status, body = call(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 20,
                                                    "temperature": 0.0, "user": "me"})
    assert status == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == expected.text and body["choices"][0]["finish_reason"] == expected.finish_reason
    assert body["usage"] == usage_of(ref, expected, prompt="Once upon a time")
    # a one-prompt list is the same request
    assert call(server, "/v1/completions", {"prompt": ["Once upon a time"], "max_tokens": 20,
                                            "temperature": 0})[1]["choices"] == body["choices"]


def test_without_max_tokens_a_request_may_fill_its_row(server, ref):
    status, body = call(server, "/v1/completions", {"prompt": "x" * 500, "temperature": 0})
    expected = ref.generate("x" * 500, max_new_tokens=12, temperature=0.0)  # the row's room: 512 - 500
    assert status == 200 and body["choices"][0]["text"] == expected.text
    assert body["usage"]["completion_tokens"] == len(expected.token_ids)


def test_harmless_fields_are_ignored(server):
    body = {"messages": HI, "max_tokens": 12, "temperature": 0}
    _, plain = call(server, "/v1/chat/completions", body)
    neutral = {"user": "u", "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "logprobs": False,
               "tool_choice": "none", "response_format": {"type": "text"}, "metadata": {"a": "b"},
               "stream_options": None, "top_k": -1}
    status, out = call(server, "/v1/chat/completions", {**body, **neutral})
    assert status == 200 and out["choices"][0]["message"] == plain["choices"][0]["message"]


def test_sampling_fields_reach_the_pipeline(server, ref):
    # the default gumbel sampler: a seeded request is plain decoding's draw with that seed, whatever the cycles
    params = dict(temperature=1.0, top_p=0.9, top_k=20, seed=7)
    expected = ref.generate("abc", max_new_tokens=16, no_draft=True, **params)
    assert expected.text != ref.generate("abc", max_new_tokens=16).text  # the fields make a difference
    for _ in range(2):
        status, out = call(server, "/v1/completions", {"prompt": "abc", "max_tokens": 16, **params})
        assert status == 200 and out["choices"][0]["text"] == expected.text
    other = call(server, "/v1/completions", {"prompt": "abc", "max_tokens": 16, **params, "seed": 8})[1]
    assert other["choices"][0]["text"] == ref.generate("abc", max_new_tokens=16, **{**params, "seed": 8}).text


def test_the_rejection_sampler_is_a_server_option(ref):
    # with it, a seeded sampled run repeats only when its cycles do: fixed verify lengths
    srv = start(options={"verify": "fixed", "sampler": "rejection"})
    try:
        params = dict(temperature=1.0, top_p=0.9, top_k=20, seed=7)
        expected = ref.generate("abc", max_new_tokens=16, verify="fixed", sampler="rejection", **params)
        for _ in range(2):
            status, out = call(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 16, **params})
            assert status == 200 and out["choices"][0]["text"] == expected.text
    finally:
        srv.shutdown()


def test_stream_chat_with_usage(server, ref):
    expected = ref.generate(messages=HI, max_new_tokens=30, temperature=0.0)
    chunks = events(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 30, "temperature": 0,
                                                     "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]"
    *choice_chunks, usage_chunk = chunks[:-1]
    assert {c["object"] for c in chunks[:-1]} == {"chat.completion.chunk"} and len({c["id"] for c in chunks[:-1]}) == 1
    assert choice_chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert streamed_text(choice_chunks) == expected.text
    finishes = [c["choices"][0]["finish_reason"] for c in choice_chunks]
    assert finishes[:-1] == [None] * (len(finishes) - 1) and finishes[-1] == expected.finish_reason
    assert "acceptance_length" in choice_chunks[-1]["blockdraft"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == usage_of(ref, expected, messages=HI)
    assert all(c["usage"] is None for c in choice_chunks)


def test_stream_completion_without_usage(server, ref):
    expected = ref.generate("def f(", max_new_tokens=25, temperature=0.0)
    chunks = events(server, "/v1/completions", {"prompt": "def f(", "max_tokens": 25, "temperature": 0})
    assert chunks[-1] == "[DONE]" and all("usage" not in c for c in chunks[:-1])
    assert {c["object"] for c in chunks[:-1]} == {"text_completion"}
    assert streamed_text(chunks) == expected.text
    assert chunks[-2]["choices"][0]["finish_reason"] == expected.finish_reason


def stop_string(text: str) -> str:
    """Two printable characters from the middle of `text` (no unfinished UTF-8)."""
    i = next(i for i in range(5, len(text) - 2) if "\ufffd" not in text[i:i + 2] and text[i:i + 2].strip())
    return text[i:i + 2]


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_strings(server, ref, as_list):
    full = ref.generate("Once upon", max_new_tokens=40, temperature=0.0)
    stop = stop_string(full.text)
    cut = full.text[: full.text.find(stop)]
    body = {"prompt": "Once upon", "max_tokens": 40, "temperature": 0, "stop": [stop] if as_list else stop}
    status, out = call(server, "/v1/completions", body)
    assert status == 200 and out["choices"][0] == {"index": 0, "text": cut, "logprobs": None, "finish_reason": "stop"}
    assert out["usage"]["completion_tokens"] == len(ref.generate("Once upon", max_new_tokens=40, stop=[stop]).token_ids)
    chunks = events(server, "/v1/completions", body)
    assert streamed_text(chunks) == cut and chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_models_and_health(server):
    status, models = call(server, "/v1/models")
    assert status == 200 and models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    health = healthy(server)
    assert health["model"] == "tiny" and health["queued"] == 0 and health["running"] == 0
    assert health["max_batch"] == 4 and health["served"] > 0 and health["failed"] == 0


def test_a_chunked_body_without_content_length_is_accepted(server, ref):
    host, port = server.socket.getsockname()[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    payload = json.dumps({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}).encode()
    conn.request("POST", "/v1/completions", body=iter([payload[:7], payload[7:]]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    response = conn.getresponse()
    out = json.load(response)
    conn.close()
    assert response.status == 200, out
    assert out["choices"][0]["text"] == ref.generate("Once upon a time", max_new_tokens=10).text


def test_long_prompts_prefill_in_chunks_and_answer_the_same(server, ref, monkeypatch):
    prompt = (LONG * 3)[:100]
    pieces: list[tuple[int, int | None]] = []
    prefill = server.scheduler.batch.prefill

    def recorded(row: int, chunk: int | None = None):
        pieces.append((row, chunk))
        return prefill(row, chunk=chunk)

    monkeypatch.setattr(server.scheduler, "prefill_chunk", 8)
    monkeypatch.setattr(server.scheduler.batch, "prefill", recorded)
    expected = ref.generate(prompt, max_new_tokens=20, temperature=0.0)  # unchunked
    status, out = call(server, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0})
    assert status == 200 and out["choices"][0]["text"] == expected.text
    assert out["usage"] == usage_of(ref, expected, prompt=prompt) and out["usage"]["prompt_tokens"] == 100
    assert len(pieces) == 13 and {chunk for _, chunk in pieces} == {8}


# ---------------------------------------------------------------------- the official openai client
def test_openai_client_chat(server, ref):
    c = client(server)
    expected = ref.generate(messages=HI, max_new_tokens=20, temperature=0.0)
    reply = c.chat.completions.create(model="tiny", messages=HI, max_tokens=20, temperature=0)
    assert reply.object == "chat.completion" and reply.model == "tiny"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) == \
        usage_of(ref, expected, messages=HI)
    stream = c.chat.completions.create(model="tiny", messages=HI, max_tokens=20, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == expected.finish_reason
    assert [m.id for m in c.models.list()] == ["tiny"]


def test_openai_client_completions_stop_and_seed(server, ref):
    c = client(server)
    full = ref.generate("Once upon", max_new_tokens=40, temperature=0.0)
    stop = stop_string(full.text)
    reply = c.completions.create(model="tiny", prompt="Once upon", max_tokens=40, temperature=0, stop=[stop])
    assert reply.choices[0].text == full.text[: full.text.find(stop)] and reply.choices[0].finish_reason == "stop"
    seeded = ref.generate("abc", max_new_tokens=16, temperature=1.0, top_p=0.9, seed=11)
    for stream in (False, True):
        got = c.completions.create(model="tiny", prompt="abc", max_tokens=16, temperature=1.0, top_p=0.9, seed=11,
                                   stream=stream)
        text = "".join(ch.choices[0].text for ch in got if ch.choices) if stream else got.choices[0].text
        assert text == seeded.text
    assert reply.usage.prompt_tokens == len(ref.encode("Once upon"))


def test_openai_client_errors(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=-1)
    assert bad.value.status_code == 400 and bad.value.param == "temperature" and "temperature=-1" in bad.value.message
    assert bad.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        c.completions.create(model="gpt-4", prompt="hi", max_tokens=4)
    assert missing.value.code == "model_not_found" and 'model="gpt-4"' in missing.value.message
    with pytest.raises(openai.BadRequestError, match="max_tokens=100000"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=100_000)
    healthy(server)


def test_api_key(ref):
    srv = start(api_key="k")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k"}):
            status, out = call(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 3}, headers=headers)
            assert status == 401 and out["error"]["code"] == "invalid_api_key"
            assert out["error"]["type"] == "invalid_request_error"
            assert "Authorization: Bearer" in out["error"]["message"]
            assert call(srv, "/v1/models", headers=headers)[0] == 401
        with pytest.raises(openai.AuthenticationError) as wrong:
            client(srv, "wrong").chat.completions.create(model="tiny", messages=HI, max_tokens=3)
        assert wrong.value.status_code == 401 and wrong.value.code == "invalid_api_key"
        right = client(srv, "k")
        reply = right.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
        assert reply.choices[0].message.content == ref.generate(messages=HI, max_new_tokens=8).text
        assert call(srv, "/v1/models", headers={"Authorization": "Bearer k"})[0] == 200
        # probes stay open
        assert call(srv, "/health")[0] == 200
        samples = scrape(srv)
        assert metric(samples, "blockdraft_requests_total", route="/v1/completions", status="401") == 3
        assert metric(samples, "blockdraft_requests_total", route="/v1/chat/completions", status="200") == 1
    finally:
        srv.shutdown()
    with pytest.raises(InvalidArgumentError, match="api_key=''"):
        BlockdraftServer(ref, ("127.0.0.1", 0), model_id="tiny", api_key="")


# ---------------------------------------------------------------------- concurrency
BURST = [("/v1/chat/completions" if i % 3 == 0 else "/v1/completions",
          {"max_tokens": 6 + 5 * (i % 4), "temperature": 0, "stream": i % 2 == 1,
           **({"messages": [{"role": "user", "content": f"question {i}?"}]} if i % 3 == 0
              else {"prompt": f"item {i}: " + "abc " * (i % 5)})})
         for i in range(12)]


def answer(srv: BlockdraftServer, path: str, body: dict) -> tuple[str, int | None]:
    """(text, completion tokens) of one request, streamed or not."""
    if body["stream"]:
        chunks = events(srv, path, body)
        assert chunks[-1] == "[DONE]"
        return streamed_text(chunks), None
    status, out = call(srv, path, body)
    assert status == 200, out
    choice = out["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"], out["usage"]["completion_tokens"]


def all_at_once(send: Callable[[int], Any], n: int) -> list[Any]:
    """send(0) .. send(n - 1) on n threads released together; their results (or exceptions) in order."""
    results: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = send(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's comparison
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_a_concurrent_burst_gets_what_each_request_gets_alone(server, ref, monkeypatch):
    expected = []
    for path, body in BURST:
        source = {"messages": body["messages"]} if "messages" in body else {"prompt": body["prompt"]}
        out = ref.generate(**source, max_new_tokens=body["max_tokens"], temperature=0.0)
        expected.append((out.text, None if body["stream"] else len(out.token_ids)))
    alone = [answer(server, path, body) for path, body in BURST]
    assert alone == expected
    before = scrape(server)
    release = hold_decoding(monkeypatch, server)  # until all 4 rows are taken: the requests overlap for sure
    threading.Thread(target=lambda: (wait_for(lambda: len(server.scheduler.running) == 4), release.set()),
                     daemon=True).start()
    assert all_at_once(lambda i: answer(server, *BURST[i]), len(BURST)) == expected
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    cycles = delta("blockdraft_cycle_rows_count")
    assert cycles > delta("blockdraft_cycle_rows_bucket", le="1.0")  # some cycles verified several rows at once
    assert delta("blockdraft_cycle_rows_bucket", le="4.0") == cycles  # never more than --max-batch 4
    assert not server.scheduler.busy and metric(after, "blockdraft_running_rows") == 0


def test_a_hybrid_target_serves_concurrent_requests_as_each_alone():
    """A Qwen3.5 target (linear-attention states rolled back every cycle) behind the official client: rows of
    its own cache each, requests overlapping, every answer what the pipeline gives alone."""
    srv = BlockdraftServer(tiny_pipeline("qwen3_5", seed=2), ("127.0.0.1", 0), model_id="tiny", max_batch=3).start()
    try:
        ref = tiny_pipeline("qwen3_5", seed=2)
        prompts = [f"item {i}: " + "abc " * i for i in range(5)]
        expected = [ref.generate(p, max_new_tokens=12 + 4 * i, temperature=0.0).text for i, p in enumerate(prompts)]

        def send(i: int) -> str:
            out = client(srv).completions.create(model="tiny", prompt=prompts[i], max_tokens=12 + 4 * i,
                                                 temperature=0)
            return out.choices[0].text

        assert all_at_once(send, len(prompts)) == expected
        chat = client(srv).chat.completions.create(model="tiny", messages=HI, max_tokens=10, temperature=0)
        assert chat.choices[0].message.content == ref.generate(messages=HI, max_new_tokens=10, temperature=0.0).text
        assert wait_for(lambda: srv.scheduler.batch.caches == [None] * 3)  # each row's states freed as it ended
    finally:
        srv.shutdown(timeout=5)


# ---------------------------------------------------------------------- metrics
def test_metrics_parse_and_count(server, ref):
    before = scrape(server)
    outs = [call(server, "/v1/completions", {"prompt": p, "max_tokens": 16, "temperature": 0})[1]
            for p in ("Once upon a time", "abc abc abc abc")]
    assert call(server, "/v1/completions", {"prompt": "x", "max_tokens": 0})[0] == 400
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("blockdraft_requests_total", route="/v1/completions", status="200") == 2
    assert delta("blockdraft_requests_total", route="/v1/completions", status="400") == 1
    assert delta("blockdraft_requests_total", route="/metrics", status="200") == 1  # the first scrape
    assert delta("blockdraft_generation_tokens_total") == sum(o["usage"]["completion_tokens"] for o in outs)
    assert delta("blockdraft_prompt_tokens_total") == sum(o["usage"]["prompt_tokens"] for o in outs)
    for name in ("blockdraft_time_to_first_token_seconds", "blockdraft_e2e_request_latency_seconds",
                 "blockdraft_time_per_output_token_seconds"):
        assert delta(f"{name}_count") == 2
    sources = {labels[0][1]: value - before.get((name, labels), 0.0) for (name, labels), value in after.items()
               if name == "blockdraft_cycles_total"}
    assert set(sources) <= {"drafter", "lookup", "plain"} and sum(sources.values()) > 0
    # one acceptance length per cycle that verified drafts (the adaptive policy may have decoded plainly)
    drafted = sources.get("drafter", 0) + sources.get("lookup", 0)
    assert delta("blockdraft_acceptance_length_count") == drafted
    assert delta("blockdraft_acceptance_length_sum") >= drafted
    assert delta("blockdraft_cycle_rows_count") > 0
    assert metric(after, "blockdraft_queue_depth") == 0 and metric(after, "blockdraft_running_rows") == 0
    kinds = {f.name: f.type for f in text_string_to_metric_families(
        urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode())}
    assert kinds["blockdraft_requests"] == "counter" and kinds["blockdraft_acceptance_length"] == "histogram"
    assert kinds["blockdraft_queue_depth"] == "gauge" and kinds["blockdraft_cycles"] == "counter"


# ---------------------------------------------------------------------- bad input
CHAT = {"messages": HI, "max_tokens": 4}
NESTED_40 = b'{"prompt": ' + b"[" * 40 + b"]" * 40 + b"}"
NESTED_1000 = b'{"prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"
ERRORS = [  # path, body override (or raw bytes), status, text(s) the message must contain, param
    ("/v1/chat/completions", {"temperature": -1}, 400, "temperature=-1: expected", "temperature"),
    ("/v1/chat/completions", {"temperature": True}, 400, "temperature=true", "temperature"),
    ("/v1/chat/completions", {"temperature": "hot"}, 400, 'temperature="hot": expected a number', "temperature"),
    ("/v1/chat/completions", {"top_p": 2}, 400, "top_p=2: expected a number in (0, 1]", "top_p"),  # the library's
    ("/v1/chat/completions", {"top_k": -2}, 400, "top_k=-2", "top_k"),
    ("/v1/chat/completions", {"seed": "x"}, 400, 'seed="x"', "seed"),
    ("/v1/chat/completions", {"max_tokens": 0}, 400, "max_tokens=0: expected an integer >= 1", "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": -5}, 400, "max_tokens=-5: expected an integer >= 1", "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": "5"}, 400, 'max_tokens="5": expected an integer', "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 10**9}, 400, "--max-model-len 512", "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 1.5}, 400, "max_completion_tokens=1.5", "max_completion_tokens"),
    ("/v1/chat/completions", {"n": 2}, 400, "n=2", "n"),
    ("/v1/chat/completions", {"presence_penalty": 0.5}, 400, "presence_penalty=0.5", "presence_penalty"),
    ("/v1/chat/completions", {"logprobs": True}, 400, "logprobs=true", "logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, 400, "tools=[{\"type\": \"function\"}]", "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, 400, "json_object", "response_format"),
    ("/v1/chat/completions", {"stop": 5}, 400, "stop=5", "stop"),
    ("/v1/chat/completions", {"stop": [""]}, 400, "stop=['']", "stop"),
    ("/v1/chat/completions", {"stream": "yes"}, 400, "stream=\"yes\": expected true or false", "stream"),
    ("/v1/chat/completions", {"stream": 1}, 400, "stream=1: expected true or false", "stream"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": "yes"}}, 400, "stream_options=", "stream_options"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages=\"hi\"", "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages=[]: expected a non-empty list", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "\"tool\"", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "image_url", "messages"),
    ("/v1/chat/completions", {"model": "gpt-4"}, 404, "model=\"gpt-4\"", "model"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt is empty", None),
    ("/v1/completions", {"prompt": None}, 400, "prompt=null", "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt=[\"a\", \"b\"]: expected a string", "prompt"),
    ("/v1/completions", {"max_tokens": None}, 400, "prompt is missing", "prompt"),
    ("/v1/completions", {"prompt": "x" * 600, "stream": True}, 400,
     "prompt has 600 tokens: expected fewer than --max-model-len 512", None),
    ("/v1/completions", {"prompt": "x" * 500, "max_tokens": 20}, 400,
     "max_tokens=20: expected at most 12 (--max-model-len 512 minus the prompt's 500 tokens)", "max_tokens"),
    ("/v1/completions", b"{not json", 400, "not valid JSON", None),
    ("/v1/completions", b"", 400, "not valid JSON", None),
    ("/v1/completions", b"[1, 2]", 400, "request body [1, 2]: expected a JSON object", None),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "not valid UTF-8 (byte 12)", None),
    ("/v1/completions", NESTED_40, 400, "nested too deeply: expected at most 32 levels", None),
    ("/v1/completions", NESTED_1000, 400, "nested too deeply: expected at most 32 levels", None),
    ("/v1/completions", b'{"prompt": "' + b"x" * 9000 + b'"}', 413, "request body of 9014 bytes: expected at most 8192",
     None),
]


@pytest.mark.parametrize("path, body, status, text, param", ERRORS)
def test_bad_requests_get_a_clear_error_and_the_server_carries_on(server, path, body, status, text, param):
    if isinstance(body, bytes):
        got, out = call(server, path, raw=body)
    else:
        got, out = call(server, path, {**CHAT, **body} if "chat" in path else {"max_tokens": 4, **body})
    assert got == status, out
    assert set(out) == {"error"} and set(out["error"]) == {"message", "type", "param", "code"}
    for part in (text,) if isinstance(text, str) else text:
        assert part in out["error"]["message"]
    assert out["error"]["param"] == param
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["code"] in (None, "model_not_found")
    assert "\n" not in out["error"]["message"]
    healthy(server)
    assert call(server, "/v1/completions", {"prompt": "ok", "max_tokens": 3})[0] == 200


def test_a_chunked_body_over_the_limit_gets_413(server):
    host, port = server.socket.getsockname()[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("POST", "/v1/completions", body=iter([b'{"prompt": "', b"x" * 5000, b"x" * 5000, b'"}']),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    response = conn.getresponse()
    out = json.load(response)
    conn.close()
    assert response.status == 413 and "request body over 8192 bytes" in out["error"]["message"]
    healthy(server)


@pytest.mark.parametrize("head", [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ten\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n{}",
    b"GARBAGE\r\n\r\n",
])
def test_an_unparsable_http_request_gets_the_error_json(server, head):
    with socket.create_connection(server.socket.getsockname()[:2], timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 400"), data
    assert b"content-type: application/json" in headers.lower()
    error = json.loads(body)["error"]
    assert "Content-Length" in error["message"] and error["type"] == "invalid_request_error"
    healthy(server)


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("POST", "/health", 405),
    ("DELETE", "/v1/models", 405), ("POST", "/metrics", 405),
])
def test_unknown_paths_and_wrong_methods(server, method, path, status):
    got, out = call(server, path, raw=b"{}" if method == "POST" else None, method=method)
    assert got == status and path in out["error"]["message"]
    assert out["error"]["type"] == "invalid_request_error"
    healthy(server)


# ---------------------------------------------------------------------- disconnects, the queue, draining
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_its_row(server, ref, monkeypatch, stream):
    hold_decoding(monkeypatch, server)  # the request cannot end by itself: only its client's leaving ends it
    before = dict(server.scheduler.counts)
    conn = open_request(server, "/v1/completions", {"prompt": HELD, "max_tokens": 400, "temperature": 0,
                                                    "stream": stream})
    assert wait_for(lambda: len(server.scheduler.running) == 1)
    if stream:
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        response.close()
    conn.close()
    assert wait_for(lambda: not server.scheduler.running)
    assert metric(scrape(server), "blockdraft_running_rows") == 0
    counts = server.scheduler.counts
    assert counts["cancelled"] == before["cancelled"] + 1 and counts["served"] == before["served"]
    monkeypatch.undo()
    expected = ref.generate(messages=HI, max_new_tokens=16, temperature=0.0)
    _, out = call(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 16, "temperature": 0})
    assert out["choices"][0]["message"]["content"] == expected.text


def test_a_full_queue_answers_429_with_retry_after(ref, monkeypatch):
    srv = start(max_batch=1, max_queue=1)
    release = hold_decoding(monkeypatch, srv)
    conns = []
    try:
        conns.append(open_request(srv, "/v1/completions", {"prompt": HELD, "max_tokens": 400, "temperature": 0,
                                                            "stream": True}))
        assert wait_for(lambda: len(srv.scheduler.running) == 1)
        conns.append(open_request(srv, "/v1/completions", {"prompt": "queued", "max_tokens": 6, "temperature": 0}))
        assert wait_for(lambda: len(srv.scheduler.waiting) == 1)
        status, out, headers = request(srv, "/v1/completions", {"prompt": "r", "max_tokens": 5})
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert out["error"]["code"] == "queue_full" and "--max-queue 1" in out["error"]["message"]
        with pytest.raises(openai.RateLimitError) as limited:
            client(srv).completions.create(model="tiny", prompt="r", max_tokens=5)
        assert int(limited.value.response.headers["retry-after"]) >= 1
        health = healthy(srv)  # busy is not unhealthy
        assert health["queued"] == 1 and health["running"] == 1
        # the running client leaves (still held: it cannot finish instead): the queued request takes its row
        conns[0].close()
        assert wait_for(lambda: srv.scheduler.counts["cancelled"] == 1)
        release.set()
        response = conns[1].getresponse()
        assert response.status == 200
        assert json.load(response)["choices"][0]["text"] == ref.generate("queued", max_new_tokens=6).text
        assert srv.scheduler.counts["cancelled"] == 1 and srv.scheduler.counts["served"] == 1
        assert metric(scrape(srv), "blockdraft_requests_total", route="/v1/completions", status="429") == 2
    finally:
        release.set()
        for conn in conns:
            conn.close()
        stop(srv)


def test_a_request_that_waits_too_long_gets_503(monkeypatch):
    srv = start(max_batch=1, max_queue_wait=0.3)
    hold_decoding(monkeypatch, srv)  # the running request keeps its row for as long as the test runs
    running = None
    try:
        running = open_request(srv, "/v1/completions", {"prompt": HELD, "max_tokens": 400, "temperature": 0,
                                                            "stream": True})
        assert wait_for(lambda: len(srv.scheduler.running) == 1)
        t0 = time.monotonic()
        status, out = call(srv, "/v1/completions", {"prompt": "late", "max_tokens": 5})
        assert status == 503 and time.monotonic() - t0 >= 0.3  # not before its time was up
        assert "--max-queue-wait 0.3" in out["error"]["message"] and out["error"]["type"] == "server_error"
        assert srv.scheduler.counts["expired"] == 1 and len(srv.scheduler.running) == 1 and srv.healthy
    finally:
        if running is not None:
            running.close()
        stop(srv)


def test_drain_finishes_running_requests_and_refuses_new_ones(ref, monkeypatch):
    srv = start(max_batch=2)
    address = srv.socket.getsockname()[:2]
    DrainClock(monkeypatch)  # never moves: the drain waits for the request however long it takes
    release = hold_decoding(monkeypatch, srv)  # the request stays running while the checks below run
    try:
        reader = StreamReader(srv, "/v1/completions", {"prompt": HELD, "max_tokens": 60, "temperature": 0})
        assert wait_for(lambda: len(srv.scheduler.running) == 1)
        srv.begin_drain()
        status, health = call(srv, "/health")
        assert status == 503 and health["status"] == "shutting down" and health["running"] == 1
        status, out = call(srv, "/v1/completions", {"prompt": "new", "max_tokens": 3})
        assert status == 503 and "shutting down" in out["error"]["message"]
        assert not srv.healthy and srv.scheduler.running
        release.set()
        reader.join(60)
        expected = ref.generate(HELD, max_new_tokens=60)
        assert reader.data[-1] == "[DONE]" and streamed_text(reader.data) == expected.text
        assert reader.data[-2]["choices"][0]["finish_reason"] == expected.finish_reason
        assert wait_for(lambda: not srv._worker.is_alive())  # the scheduler stops once drained
        assert srv.worker_error is None and srv.scheduler.counts["served"] == 1
    finally:
        release.set()
        stop(srv)
    with pytest.raises(OSError):
        socket.create_connection(address, 1)


def test_a_drain_that_runs_out_of_time_ends_what_is_left_with_503s(monkeypatch):
    srv = start(max_batch=1, drain_timeout=30)
    clock = DrainClock(monkeypatch)
    hold_decoding(monkeypatch, srv)  # never released: the running request could only end by the drain's timeout
    try:
        reader = StreamReader(srv, "/v1/completions", {"prompt": HELD, "max_tokens": 400, "temperature": 0})
        assert wait_for(lambda: len(srv.scheduler.running) == 1)
        queued = open_request(srv, "/v1/completions", {"prompt": "q", "max_tokens": 5})
        assert wait_for(lambda: len(srv.scheduler.waiting) == 1)
        srv.begin_drain()  # as SIGTERM does; no shutdown() call
        reads = clock.reads
        assert wait_for(lambda: clock.reads >= reads + 3)  # the drain has looked at the clock a few times...
        assert srv._worker.is_alive() and len(srv.scheduler.running) == 1 and len(srv.scheduler.waiting) == 1
        clock.advance(29)  # ...and waits while its 30 s are not up...
        assert wait_for(lambda: clock.reads >= reads + 6)
        assert srv._worker.is_alive() and len(srv.scheduler.waiting) == 1
        clock.advance(2)  # ...then they are
        response = queued.getresponse()
        assert response.status == 503 and "shutting down" in json.load(response)["error"]["message"]
        reader.join(60)
        assert not reader.is_alive() and reader.status in (200, 503)  # 200: the stream had started
        assert "shutting down" in reader.data[-1]["error"]["message"]
        assert wait_for(lambda: not srv._worker.is_alive()) and not srv.scheduler.busy and srv.worker_error is None
    finally:
        stop(srv)


def test_shutdown_now_ends_a_running_stream_with_an_error(monkeypatch):
    srv = start(max_batch=1)
    host, port = srv.socket.getsockname()[:2]
    hold_decoding(monkeypatch, srv)  # the stream cannot finish before the shutdown
    reader = StreamReader(srv, "/v1/chat/completions", {"messages": HI, "max_tokens": 400, "temperature": 0})
    assert wait_for(lambda: reader.status == 200)
    queued = open_request(srv, "/v1/completions", {"prompt": "q", "max_tokens": 5})
    assert wait_for(lambda: len(srv.scheduler.waiting) == 1)
    srv.shutdown(timeout=0)
    reader.join(60)
    assert not reader.is_alive() and srv.worker_error is None
    last = reader.data[-1]
    assert last != "[DONE]" and "server is shutting down" in last["error"]["message"]
    assert last["error"]["type"] == "server_error"
    assert all(c["choices"][0]["finish_reason"] is None for c in reader.data[:-1])
    response = queued.getresponse()
    assert response.status == 503 and "shutting down" in json.load(response)["error"]["message"]
    assert srv.scheduler.counts["cancelled"] == 2
    with pytest.raises(OSError):
        socket.create_connection((host, port), 1)


# ---------------------------------------------------------------------- the load client and the CLI
def test_the_bench_load_client_measures_it(server, ref):
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},), source="test")
               for i in range(2)]
    outs = [ref.generate(messages=list(p.messages), max_new_tokens=12, temperature=0.0) for p in prompts]
    result = server_sweep(server.url + "/v1", prompts, [1, 2], model=None, max_tokens=12, temperature=0.0,
                          requests_per_level=4, progress=False, warmup=0, texts=True)
    assert result["model"] == "tiny"
    for level in result["levels"]:
        assert level["errors"] == 0 and level["ok"] == 4 and level["token_count"] == "usage"
        assert level["output_tokens"] == 2 * sum(len(o.token_ids) for o in outs)
        assert level["texts"] == [outs[i % 2].text for i in range(4)]


@pytest.fixture
def signals_restored() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def signal_handler_of(srv: BlockdraftServer, sig: signal.Signals) -> Callable[[int, Any], None]:
    """The handler `serve()` installed for `sig` (checked to be the server's): tests call it where the signal
    would (the real signals go to a `blockdraft serve` process in test_a_real_sigterm_drains...), never sending
    one to the test process, which a missing handler would kill or interrupt."""
    handler = signal.getsignal(sig)
    assert getattr(handler, "__self__", None) is srv and handler.__func__ is BlockdraftServer._on_signal, handler
    return handler


def test_cli_serve_starts_and_drains_on_sigterm(capsys, monkeypatch, tiny_target_dir, signals_restored):
    serve, seen = BlockdraftServer.serve, {}

    def client_then_sigterm() -> None:
        srv = seen["server"]
        try:
            assert wait_for(lambda: srv.healthy)
            seen["address"] = srv.socket.getsockname()[:2]
            seen["health"] = healthy(srv)
            seen["answer"] = call(srv, "/v1/completions", {"prompt": "hello", "max_tokens": 5, "temperature": 0})
            signal_handler_of(srv, signal.SIGTERM)(signal.SIGTERM, None)
            seen["drained"] = True
        finally:
            if "drained" not in seen:  # the assertions below fail; stop the server rather than hang
                srv.scheduler.stop()

    def record(self: BlockdraftServer) -> None:
        seen["server"] = self
        seen["main thread"] = threading.current_thread() is threading.main_thread()
        seen["handlers"] = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        threading.Thread(target=client_then_sigterm, daemon=True).start()
        serve(self)
        seen["after serve"] = {sig: signal.getsignal(sig) for sig in seen["handlers"]}

    monkeypatch.setattr(BlockdraftServer, "serve", record)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = main(["serve", "--target", str(tiny_target_dir), "--port", "0", "--max-queue", "3", "--max-batch", "2",
                 "--no-draft"])
    _, err = capsys.readouterr()
    assert seen.get("drained"), "the server's SIGTERM handler was not called"
    assert code == 0 and seen["main thread"]  # the model runs on the thread that loaded it
    assert seen["after serve"] == seen["handlers"]  # serve() put back the handlers it found
    assert {sig: signal.getsignal(sig) for sig in before} == before  # and main() the caller's
    assert seen["health"]["model"] == str(tiny_target_dir) and seen["health"]["max_batch"] == 2
    status, out = seen["answer"]
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert "--max-batch 2 rows x --max-model-len" in err and "up to 3 queued" in err and "stopped" in err
    assert "at http://127.0.0.1:" in err
    with pytest.raises(OSError):
        socket.create_connection(seen["address"], 1)


def test_serve_drains_on_a_first_signal_and_stops_on_a_second(monkeypatch, signals_restored):
    srv = BlockdraftServer(tiny_pipeline("qwen3", seed=2, fast=True), ("127.0.0.1", 0), model_id="tiny", max_batch=1)
    DrainClock(monkeypatch)  # the drain never runs out of time: only the second signal can end it
    hold_decoding(monkeypatch, srv)  # nor can the running request end it by finishing
    seen: dict[str, Any] = {}

    def client_and_signals() -> None:
        try:
            assert wait_for(lambda: srv.healthy)
            seen["reader"] = reader = StreamReader(srv, "/v1/completions",
                                                   {"prompt": HELD, "max_tokens": 400, "temperature": 0})
            assert wait_for(lambda: reader.status == 200)
            signal_handler_of(srv, signal.SIGTERM)(signal.SIGTERM, None)
            assert wait_for(lambda: srv.draining.is_set())
            seen["health"] = call(srv, "/health")
            seen["running"] = len(srv.scheduler.running)  # the drain waits for it...
            signal_handler_of(srv, signal.SIGINT)(signal.SIGINT, None)  # ...a second signal does not
            seen["stopped"] = wait_for(lambda: not srv._worker_alive)
        finally:
            if not seen.get("stopped"):  # the assertions below fail; stop the server rather than hang
                srv.scheduler.stop()

    threading.Thread(target=client_and_signals, daemon=True).start()
    srv.serve()  # here, on the main thread, until the second signal
    assert seen.get("stopped") and srv.worker_error is None
    assert seen["health"][0] == 503 and seen["health"][1]["status"] == "shutting down" and seen["running"] == 1
    reader = seen["reader"]
    reader.join(60)
    assert reader.data[-1] != "[DONE]" and "shutting down" in reader.data[-1]["error"]["message"]


HELD_SERVE = """
import sys
from blockdraft.cli import main
from blockdraft.decoding.batch_engine import Batch
Batch.decoding_rows = lambda self: []  # every request stays running until the server stops it
sys.exit(main(["serve", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_a_real_sigterm_drains_blockdraft_serve_and_a_second_signal_stops_it(tiny_target_dir):
    """`blockdraft serve` in a process of its own, sent real signals: SIGTERM drains (503s, the running
    request kept), SIGINT then stops it at once (the request gets the error), and it exits 0. Its decoding is
    held and its drain timeout an hour, so only the second signal can end it."""
    proc = subprocess.Popen([sys.executable, "-c", HELD_SERVE, "--target", str(tiny_target_dir), "--port", "0",
                             "--no-draft", "--max-batch", "1", "--drain-timeout", "3600"],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    err: list[str] = []
    collect = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    collect.start()
    try:
        assert wait_for(lambda: any(" at http://" in line for line in err) or proc.poll() is not None, 300)
        started = [line for line in err if " at http://" in line]
        assert started, "".join(err)
        srv = SimpleNamespace(url=started[0].split(" at ")[1].split("/v1")[0])
        reader = StreamReader(srv, "/v1/completions", {"prompt": HELD, "max_tokens": 400, "temperature": 0})
        assert wait_for(lambda: reader.status == 200)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: call(srv, "/health")[0] == 503)
        status, health = call(srv, "/health")
        assert health["status"] == "shutting down" and health["running"] == 1
        assert call(srv, "/v1/completions", {"prompt": "new", "max_tokens": 3})[0] == 503
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, "".join(err)
        collect.join(30)
        assert any("second SIGINT: stopping without waiting" in line for line in err), "".join(err)
        reader.join(60)
        assert reader.data[-1] != "[DONE]" and "shutting down" in reader.data[-1]["error"]["message"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, message", [
    (["--block-size", "99"], "block_size=99"),  # checked only when drafting: no --no-draft here
    (["--max-queue", "0"], "max_queue=0"),
    (["--max-batch", "0"], "max_batch=0"),
    (["--prefill-chunk", "0"], "prefill_chunk=0"),
    (["--max-model-len", "100000"], "max_model_len=100000"),
    (["--max-queue-wait", "0"], "max_queue_wait=0"),
    (["--api-key", ""], "api_key=''"),
    (["--port", "{busy}"], "cannot listen on 127.0.0.1:{busy}"),
])
def test_cli_serve_errors_exit_2(capsys, monkeypatch, tiny_target_dir, args, message):
    def started(self: BlockdraftServer) -> None:  # instead of serving forever
        self.close()
        raise AssertionError("the server started")

    monkeypatch.setattr(BlockdraftServer, "serve", started)
    no_draft = [] if "--block-size" in args else ["--no-draft"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", "--target", str(tiny_target_dir), "--port", "0", *no_draft,
                     *(a.format(busy=port) for a in args)])
    _, err = capsys.readouterr()
    [line] = [ln for ln in err.splitlines() if ln.startswith("blockdraft: error:")]
    assert code == 2 and message.format(busy=port) in line
