"""The OpenAI-compatible server over real HTTP, on tiny random models (port 0, background thread)."""
from __future__ import annotations

import _thread
import http.client
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from blockdraft.api import TextStream
from blockdraft.bench.load_client import server_sweep
from blockdraft.cli import main
from blockdraft.errors import InvalidArgumentError
from blockdraft.prompts import Prompt
from blockdraft.serving.server import BlockdraftServer, Worker
from tests.conftest import tiny_pipeline

HI = [{"role": "user", "content": "hi"}]


def start(pipe: Any, **kw: Any) -> BlockdraftServer:
    srv = BlockdraftServer(pipe, ("127.0.0.1", 0), model_id="tiny", **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def stop(srv: BlockdraftServer) -> None:
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[BlockdraftServer]:
    srv = start(tiny_pipeline("qwen3", seed=2), max_body_bytes=2048)
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def ref():
    """The same tiny pair as the server's, driven here directly (never from two threads at once)."""
    return tiny_pipeline("qwen3", seed=2)


def call(srv: BlockdraftServer, path: str, body: Any = None, *, raw: bytes | None = None,
         method: str | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(srv.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def events(srv: BlockdraftServer, path: str, body: dict) -> list[Any]:
    """The `data:` payloads of a streamed answer, JSON-decoded except the final "[DONE]"."""
    request = urllib.request.Request(srv.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        lines = [ln.decode().strip() for ln in response]
    data = [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def usage_of(ref, out, **source) -> dict[str, int]:
    prompt = len(ref.encode(**source))
    return {"prompt_tokens": prompt, "completion_tokens": len(out.token_ids),
            "total_tokens": prompt + len(out.token_ids)}


def healthy(srv: BlockdraftServer) -> dict:
    status, body = call(srv, "/health")
    assert status == 200 and body["status"] == "ok"
    return body


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
    assert body["blockdraft"]["acceptance_length"] >= 1 and body["blockdraft"]["tokens_per_second"] > 0


def test_completion_equals_pipeline_generate(server, ref):
    expected = ref.generate("Once upon a time", max_new_tokens=20, temperature=0.0)
    status, body = call(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 20,
                                                    "temperature": 0.0, "user": "me"})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == expected.text and body["choices"][0]["finish_reason"] == expected.finish_reason
    assert body["usage"] == usage_of(ref, expected, prompt="Once upon a time")


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
    for _ in range(2):
        status, out = call(server, "/v1/completions", {"prompt": "abc", "max_tokens": 16, **params})
        assert status == 200 and out["choices"][0]["text"] == expected.text


def test_the_rejection_sampler_is_a_server_option(ref):
    # with it, a seeded sampled run repeats only when its cycles do: fixed verify lengths
    srv = start(tiny_pipeline("qwen3", seed=2), options={"verify": "fixed", "sampler": "rejection"})
    try:
        params = dict(temperature=1.0, top_p=0.9, top_k=20, seed=7)
        expected = ref.generate("abc", max_new_tokens=16, verify="fixed", sampler="rejection", **params)
        for _ in range(2):
            status, out = call(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 16, **params})
            assert status == 200 and out["choices"][0]["text"] == expected.text
    finally:
        stop(srv)


def test_stream_chat_with_usage(server, ref):
    expected = ref.generate(messages=HI, max_new_tokens=30, temperature=0.0)
    chunks = events(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 30, "temperature": 0,
                                                     "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]"
    *choice_chunks, usage_chunk = chunks[:-1]
    assert {c["object"] for c in chunks[:-1]} == {"chat.completion.chunk"} and len({c["id"] for c in chunks[:-1]}) == 1
    assert choice_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in choice_chunks)
    assert text == expected.text
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
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == expected.text
    assert chunks[-2]["choices"][0]["finish_reason"] == expected.finish_reason


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_strings(server, ref, as_list):
    full = ref.generate("Once upon", max_new_tokens=40, temperature=0.0)
    start_at = next(i for i in range(5, len(full.text) - 2) if "\ufffd" not in full.text[i:i + 2])
    stop = full.text[start_at:start_at + 2]
    cut = full.text[: full.text.find(stop)]
    body = {"prompt": "Once upon", "max_tokens": 40, "temperature": 0, "stop": [stop] if as_list else stop}
    status, out = call(server, "/v1/completions", body)
    assert status == 200 and out["choices"][0] == {"index": 0, "text": cut, "logprobs": None, "finish_reason": "stop"}
    chunks = events(server, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == cut


def test_models_and_health(server):
    status, models = call(server, "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    health = healthy(server)
    assert health["model"] == "tiny" and health["queued"] == 0 and health["failed"] >= 0


# ---------------------------------------------------------------------- errors
CHAT = {"messages": HI, "max_tokens": 4}
ERRORS = [  # path, body override (or raw bytes), status, text the message must contain, param
    ("/v1/chat/completions", {"temperature": -1}, 400, "temperature=-1", "temperature"),
    ("/v1/chat/completions", {"temperature": True}, 400, "temperature=true", "temperature"),
    ("/v1/chat/completions", {"top_p": 2}, 400, "top_p=2", "top_p"),
    ("/v1/chat/completions", {"top_k": -2}, 400, "top_k=-2", "top_k"),
    ("/v1/chat/completions", {"seed": "x"}, 400, "seed='x'", "seed"),
    ("/v1/chat/completions", {"max_tokens": 0}, 400, "max_tokens=0", "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 1.5}, 400, "max_completion_tokens=1.5", "max_completion_tokens"),
    ("/v1/chat/completions", {"n": 2}, 400, "n=2", "n"),
    ("/v1/chat/completions", {"presence_penalty": 0.5}, 400, "presence_penalty=0.5", "presence_penalty"),
    ("/v1/chat/completions", {"logprobs": True}, 400, "logprobs=true", "logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, 400, "tools=[{\"type\": \"function\"}]", "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, 400, "json_object", "response_format"),
    ("/v1/chat/completions", {"stop": 5}, 400, "stop=5", "stop"),
    ("/v1/chat/completions", {"stop": [""]}, 400, "stop=['']", "stop"),
    ("/v1/chat/completions", {"stream": "yes"}, 400, "stream=\"yes\"", "stream"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages=\"hi\"", "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages=[]", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "\"tool\"", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "image_url", "messages"),
    ("/v1/chat/completions", {"model": "gpt-4"}, 404, "model=\"gpt-4\"", "model"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt is empty", None),
    ("/v1/completions", {"prompt": None}, 400, "prompt=null", "prompt"),
    ("/v1/completions", {"prompt": "x" * 600, "stream": True}, 400, "prompt has 600 tokens", None),
    ("/v1/completions", b"{not json", 400, "not valid JSON", None),
    ("/v1/completions", b"[1, 2]", 400, "request body [1, 2]", None),
    ("/v1/completions", b'{"prompt": "' + b"x" * 3000 + b'"}', 413, "3014 bytes", None),
]


@pytest.mark.parametrize("path, body, status, text, param", ERRORS)
def test_bad_requests_get_a_clear_error_and_the_server_carries_on(server, path, body, status, text, param):
    if isinstance(body, bytes):
        got, out = call(server, path, raw=body)
    else:
        got, out = call(server, path, {**CHAT, **body} if "chat" in path else {"max_tokens": 4, **body})
    assert got == status
    assert text in out["error"]["message"] and out["error"]["param"] == param
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["code"] in (None, "model_not_found")
    assert "\n" not in out["error"]["message"]
    healthy(server)
    assert call(server, "/v1/completions", {"prompt": "ok", "max_tokens": 3})[0] == 200


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("POST", "/health", 405),
    ("DELETE", "/v1/models", 405),
])
def test_unknown_paths_and_wrong_methods(server, method, path, status):
    got, out = call(server, path, raw=b"{}" if method == "POST" else None, method=method)
    assert got == status and path in out["error"]["message"]
    healthy(server)


# ---------------------------------------------------------------------- disconnects and the queue
def open_stream(srv: BlockdraftServer, path: str, body: dict) -> http.client.HTTPConnection:
    """Send a request on a raw connection and return it unread (the caller reads some, then hangs up)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_disconnect_mid_stream_leaves_the_model_serving(server, ref):
    before = healthy(server)
    conn = open_stream(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 400, "temperature": 0,
                                                        "stream": True})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    response.close()
    conn.close()
    assert wait_for(lambda: (lambda h: h["served"] + h["cancelled"] > before["served"] + before["cancelled"]
                             and not h["running"])(healthy(server)))
    expected = ref.generate(messages=HI, max_new_tokens=16, temperature=0.0)
    _, out = call(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 16, "temperature": 0})
    assert out["choices"][0]["message"]["content"] == expected.text


class EndlessPipe:
    """Stands in for a Pipeline: each stream yields "x" every 10 ms until closed, which it records."""

    def __init__(self) -> None:
        self.target = SimpleNamespace(max_positions=64)
        self.drafter = None
        self.started = 0
        self.closed = 0

    def stream(self, **_: Any) -> TextStream:
        return TextStream(self._deltas())

    def _deltas(self) -> Iterator[str]:
        self.started += 1
        try:
            while True:
                time.sleep(0.01)
                yield "x"
        finally:
            self.closed += 1


@pytest.fixture
def endless() -> Iterator[tuple[BlockdraftServer, EndlessPipe]]:
    pipe = EndlessPipe()
    srv = start(pipe, max_queue=1)
    yield srv, pipe
    stop(srv)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_cancels_its_generation(endless, stream):
    srv, pipe = endless
    conn = open_stream(srv, "/v1/completions", {"prompt": "p", "stream": stream})
    assert wait_for(lambda: pipe.started == 1)
    if stream:
        response = conn.getresponse()
        assert response.readline().startswith(b"data: ")
        response.close()
    conn.close()
    assert wait_for(lambda: pipe.closed == 1, timeout=5)  # the generator was closed, not left running
    assert wait_for(lambda: healthy(srv)["cancelled"] == 1 and not healthy(srv)["running"])


def test_a_full_queue_answers_503(endless):
    srv, pipe = endless
    running = open_stream(srv, "/v1/completions", {"prompt": "p", "stream": True})
    assert wait_for(lambda: pipe.started == 1)
    response = running.getresponse()
    queued = open_stream(srv, "/v1/completions", {"prompt": "q"})
    assert wait_for(lambda: healthy(srv)["queued"] == 1)
    status, out = call(srv, "/v1/completions", {"prompt": "r"})
    assert status == 503 and "1 requests already queued" in out["error"]["message"]
    assert out["error"]["type"] == "server_error"
    response.close()
    running.close()
    assert wait_for(lambda: pipe.started == 2)  # FIFO: the queued request runs next
    queued.close()
    assert wait_for(lambda: pipe.closed == 2 and healthy(srv)["cancelled"] == 2)


def test_shutdown_ends_the_running_and_the_queued_requests():
    pipe = EndlessPipe()
    srv = start(pipe, max_queue=2)
    running = open_stream(srv, "/v1/chat/completions", {"messages": HI, "stream": True})
    assert wait_for(lambda: pipe.started == 1)
    queued = open_stream(srv, "/v1/completions", {"prompt": "q"})
    assert wait_for(lambda: healthy(srv)["queued"] == 1)
    stop(srv)
    assert pipe.closed == 1 and pipe.started == 1
    last = [ln for ln in running.getresponse().read().decode().splitlines() if ln.startswith("data: ")][-1]
    assert "server is shutting down" in json.loads(last[len("data: "):])["error"]["message"]
    response = queued.getresponse()
    assert response.status == 503 and "shutting down" in json.load(response)["error"]["message"]


# ---------------------------------------------------------------------- the load client and the CLI
def test_the_bench_load_client_measures_it(server, ref):
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},), source="test")
               for i in range(2)]
    tokens = [len(ref.generate(messages=list(p.messages), max_new_tokens=12, temperature=0.0).token_ids)
              for p in prompts]
    result = server_sweep(server.url + "/v1", prompts, [1, 2], model=None, max_tokens=12, temperature=0.0,
                          requests_per_level=4, progress=False, warmup=0)
    assert result["model"] == "tiny"
    for level in result["levels"]:
        assert level["errors"] == 0 and level["ok"] == 4 and level["token_count"] == "usage"
        assert level["output_tokens"] == 2 * sum(tokens)


def test_cli_serve_starts_and_stops(capsys, monkeypatch, tiny_target_dir):
    serve_here, seen = BlockdraftServer.serve_here, {}

    def record(self: BlockdraftServer) -> None:
        seen["server"] = self
        serve_here(self)

    def ctrl_c_after_a_request(worker: Worker) -> None:
        seen.update(healthy(seen["server"]))
        seen["main thread"] = threading.current_thread() is threading.main_thread()
        raise KeyboardInterrupt

    monkeypatch.setattr(BlockdraftServer, "serve_here", record)
    monkeypatch.setattr(Worker, "run", ctrl_c_after_a_request)
    code = main(["serve", "--target", str(tiny_target_dir), "--port", "0", "--max-queue", "3", "--no-draft"])
    _, err = capsys.readouterr()
    assert code == 0 and seen["model"] == str(tiny_target_dir)
    assert seen["main thread"]  # the model runs on the thread that loaded it (see Worker)
    assert "at http://127.0.0.1:" in err and "up to 3 queued" in err and "shutting down" in err


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as in a terminal (a background job of a non-interactive shell
    starts with SIGINT ignored, and `_thread.interrupt_main` would then do nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_on_the_worker_thread_ends_the_running_stream_with_a_503(ctrl_c_raises):
    pipe = EndlessPipe()
    srv = BlockdraftServer(pipe, ("127.0.0.1", 0), model_id="tiny", worker_thread=False)
    lines: list[bytes] = []

    def client() -> None:
        conn = open_stream(srv, "/v1/completions", {"prompt": "p", "stream": True})
        response = conn.getresponse()
        lines.append(response.readline())
        wait_for(lambda: pipe.started == 1)
        _thread.interrupt_main()  # what Ctrl-C does to the main thread
        lines.extend(response.read().split(b"\n\n"))

    threading.Thread(target=client, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            srv.serve_here()
    finally:
        srv.server_close()
    assert wait_for(lambda: any(b"shutting down" in line for line in lines))
    assert pipe.closed == 1 and not any(b"finish_reason\": \"" in line for line in lines)
    threaded = BlockdraftServer(pipe, ("127.0.0.1", 0), model_id="tiny")
    with pytest.raises(InvalidArgumentError, match="worker_thread=False"):
        threaded.serve_here()
    threaded.server_close()


@pytest.mark.parametrize("args, message", [
    (["--block-size", "99"], "block_size=99"),
    (["--max-queue", "0"], "max_queue=0"),
    (["--port", "{busy}"], "cannot listen on 127.0.0.1:{busy}"),
])
def test_cli_serve_errors_exit_2(capsys, tiny_target_dir, args, message):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", "--target", str(tiny_target_dir), "--port", "0",
                     *(a.format(busy=port) for a in args)])
    _, err = capsys.readouterr()
    [line] = [ln for ln in err.splitlines() if ln.startswith("blockdraft: error:")]
    assert code == 2 and message.format(busy=port) in line
