"""OpenAI-compatible HTTP server over a `Pipeline` (standard library only).

    POST /v1/chat/completions   messages -> chat.completion (or chat.completion.chunk events)
    POST /v1/completions        prompt   -> text_completion (or text_completion events)
    GET  /v1/models             the served model id
    GET  /health                status and request counts

One worker thread owns the Pipeline and runs requests one at a time in arrival order (FIFO): torch models
are not safe to drive from several threads. HTTP handler threads only parse, queue, wait and write. The
queue is bounded (`max_queue` waiting requests; full -> 503). A client that goes away (a write fails, or
its socket is closed while it waits) cancels its request: the worker closes the generation at its next
text delta and moves on. Continuous batching across requests is future work (`Pipeline.generate_batch`
does it offline). The server only calls `Pipeline.stream`, so its output is exactly the Pipeline's.
"""
from __future__ import annotations

import json
import logging
import queue
import re
import socket
import threading
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from blockdraft.api import GenerationOutput, Pipeline
from blockdraft.errors import BlockdraftError, InvalidArgumentError

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 4 << 20
_POLL_S = 0.25  # how often a waiting handler checks that its client is still connected
_ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET", "/health": "GET"}
_ROLES = ("system", "user", "assistant")
_SAMPLING = ("temperature", "top_p", "top_k", "seed")  # passed through; the library validates them
_MAX_SHOWN = 80

# Fields that would change the output and that we cannot honour: (accepted when, what is expected).
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v in (None, 1), "1 (one choice per request)"),
    "best_of": (lambda v: v in (None, 1), "1"),
    "presence_penalty": (lambda v: v in (None, 0), "0 (penalties are not supported)"),
    "frequency_penalty": (lambda v: v in (None, 0), "0 (penalties are not supported)"),
    "repetition_penalty": (lambda v: v in (None, 1), "1 (penalties are not supported)"),
    "logit_bias": (lambda v: not v, "null or {} (logit bias is not supported)"),
    "logprobs": (lambda v: v in (None, False, 0), "null or false (log probabilities are not returned)"),
    "top_logprobs": (lambda v: not v, "null or 0 (log probabilities are not returned)"),
    "echo": (lambda v: not v, "false"),
    "suffix": (lambda v: not v, "null (no insertion mode)"),
    "tools": (lambda v: not v, "null (tool calls are not supported)"),
    "tool_choice": (lambda v: v in (None, "none"), "null or \"none\""),
    "functions": (lambda v: not v, "null (function calls are not supported)"),
    "function_call": (lambda v: v in (None, "none"), "null or \"none\""),
    "response_format": (lambda v: v is None or v == {"type": "text"}, "{\"type\": \"text\"} (no structured output)"),
}


class ApiError(Exception):
    """An error answered with an HTTP status and OpenAI's error JSON; the message names the bad value."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def _show(value: Any) -> str:
    """A request value as JSON, shortened for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


# ---------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Request:
    """One parsed completion request: the keywords for `Pipeline.stream` and how to answer."""
    chat: bool
    stream: bool
    include_usage: bool
    kwargs: dict[str, Any]


def parse_request(body: Any, *, chat: bool, model_id: str, max_tokens: int) -> Request:
    """Check an OpenAI request body and map it to `Pipeline.stream` keywords (`max_tokens`: the default).

    Unknown fields are ignored; fields in `_REFUSED` at a value that would change the output are a 400.
    Sampling values go to the library unchanged, so its own messages name what is wrong with them.
    """
    if not isinstance(body, dict):
        raise ApiError(400, f"request body {_show(body)}: expected a JSON object")
    _check_model(body.get("model"), model_id)
    for name, (accepted, expected) in _REFUSED.items():
        if not accepted(body.get(name)):
            raise ApiError(400, f"{name}={_show(body[name])}: not supported by this server, expected {expected}", name)
    stream = _flag(body.get("stream"), "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, f"stream_options={_show(options)}: expected an object", "stream_options")
    include_usage = stream and _flag(options.get("include_usage"), "stream_options.include_usage")
    source = {"messages": _messages(body.get("messages"))} if chat else {"prompt": _prompt(body.get("prompt"))}
    kwargs = {"temperature": 1.0, **_sampling(body), **source, "max_new_tokens": _max_tokens(body, max_tokens),
              "stop": _stop(body.get("stop"))}
    return Request(chat, stream, include_usage, kwargs)


def _check_model(model: Any, model_id: str) -> None:
    if model is not None and model != model_id:
        raise ApiError(404, f"model={_show(model)} is not served here: expected {_show(model_id)}", "model",
                       "model_not_found")


def _flag(value: Any, name: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name}={_show(value)}: expected true or false", name)
    return bool(value)


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """temperature / top_p / top_k / seed as given (null = default); top_k -1 means off, as in vLLM."""
    given = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    for name, value in given.items():
        if isinstance(value, bool):
            raise ApiError(400, f"{name}={_show(value)}: expected a number", name)
    if given.get("top_k") == -1:
        given["top_k"] = 0
    return given


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"messages={_show(value)}: expected a non-empty list of {{role, content}} objects",
                       "messages")
    return [_message(m) for m in value]


def _message(message: Any) -> dict[str, str]:
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise ApiError(400, f"message {_show(message)}: expected an object with a role in {list(_ROLES)}",
                       "messages")
    return {"role": message["role"], "content": _content(message.get("content"))}


def _content(content: Any) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise ApiError(400, f"message content {_show(content)}: expected a string or a list of "
                        "{\"type\": \"text\", \"text\": ...} parts", "messages")


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ApiError(400, f"prompt={_show(value)}: expected a string (one prompt per request)", "prompt")
    return value


def _max_tokens(body: dict[str, Any], default: int) -> int:
    """max_completion_tokens (OpenAI's current name) or max_tokens; default: up to the target's context."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{name}={_show(value)}: expected an integer >= 1", name)
    return value


def _stop(value: Any) -> list[Any]:
    """OpenAI's stop: null, a string or a list (the library checks the list's items)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return value
    raise ApiError(400, f"stop={_show(value)}: expected a string or a list of strings", "stop")


def _library_error(exc: BlockdraftError) -> ApiError:
    """A library error as a 400; `param` is the request field its message starts with ("top_p=2: ...")."""
    match = re.match(r"(\w+)=", str(exc))
    param = match.group(1) if match and match.group(1) in (*_SAMPLING, "stop") else None
    return ApiError(400, str(exc), param)


# ---------------------------------------------------------------------- the worker
@dataclass
class Job:
    """One queued request. The worker puts events for its handler: ("delta", str) when `deltas` (streaming),
    then ("done", GenerationOutput), or ("error", ApiError) at any point; the handler sets `cancelled` when its
    client left."""
    id: str
    kwargs: dict[str, Any]
    deltas: bool
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)
    queue_seconds: float = 0.0


class Worker:
    """The one thread that drives the Pipeline: runs queued jobs in FIFO order, one at a time.

    With `thread=True` it starts its own thread; otherwise the caller runs `run()` on a thread of its choice.
    Prefer the thread that already ran the model (the main one): torch drives a model much slower from a
    second thread once the first has run it (measured on a 2-core CPU: a 1-token step of the default target
    44 -> 62-70 ms, generation 34 -> 27 tok/s; an OpenMP matter: with OMP_WAIT_POLICY=PASSIVE both threads
    take ~63 ms, so the main thread's fast case is its team spinning between parallel regions), so `blockdraft serve`
    runs the worker on the main thread and answers HTTP from the others (`BlockdraftServer.serve_here`)."""

    def __init__(self, pipe: Pipeline, max_queue: int = DEFAULT_MAX_QUEUE, thread: bool = True) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise InvalidArgumentError(f"max_queue={max_queue!r}: expected an integer >= 1")
        self.pipe = pipe
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.counts: Counter[str] = Counter()  # served, cancelled, failed (500); written by the worker only
        self.current: Job | None = None
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.run, name="blockdraft-worker", daemon=True) if thread else None
        if self.thread is not None:
            self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`, or answer 503 when the queue is full or the server is stopping."""
        if self.closed.is_set():
            raise ApiError(503, "server is shutting down")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise ApiError(503, f"server busy: {self.jobs.maxsize} requests already queued behind the running "
                                "one (requests run one at a time); retry later") from None

    def stop(self, timeout: float = 10.0) -> None:
        """Answer queued jobs 503, end the running one at its next delta, and end `run`."""
        self.closed.set()
        with suppress(queue.Empty):
            while True:
                job = self.jobs.get_nowait()
                if job is not None:
                    job.events.put(("error", ApiError(503, "server is shutting down")))
        with suppress(queue.Full):
            self.jobs.put(None, timeout=timeout)
        if self.thread is not None:
            self.thread.join(timeout)

    def run(self) -> None:
        """Serve queued jobs until `stop`. A Ctrl-C on this thread ends the running job with a 503 and returns
        through the KeyboardInterrupt."""
        while (job := self.jobs.get()) is not None:
            if self.closed.is_set():
                job.events.put(("error", ApiError(503, "server is shutting down")))
                continue
            self.current = job
            try:
                self._run(job)
            except BaseException:
                job.events.put(("error", ApiError(503, "server is shutting down")))
                raise
            finally:
                self.current = None

    def _run(self, job: Job) -> None:
        """Run one job to its end; never raises, so no request can stop the worker."""
        job.queue_seconds = time.perf_counter() - job.queued_at
        try:
            if job.cancelled.is_set() or not self._generate(job):
                self.counts["cancelled"] += 1
                log.info("%s: cancelled (%s)", job.id, "shutdown" if self.closed.is_set() else "client gone")
                if self.closed.is_set():  # its client may still be there: tell it why the answer ends
                    job.events.put(("error", ApiError(503, "server is shutting down")))
        except BlockdraftError as exc:  # a bad request the library caught (e.g. a prompt too long)
            job.events.put(("error", _library_error(exc)))
        except Exception as exc:  # noqa: BLE001 - a failed request must not take the worker down
            self.counts["failed"] += 1
            log.exception("%s: generation failed", job.id)
            job.events.put(("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}")))

    def _generate(self, job: Job) -> bool:
        """Stream the job's deltas to its handler; False when its client left before the end."""
        stream = self.pipe.stream(**job.kwargs)
        try:
            for delta in stream:
                if job.cancelled.is_set() or self.closed.is_set():
                    return False
                if job.deltas:
                    job.events.put(("delta", delta))
        finally:
            stream.close()
        out = stream.output
        job.events.put(("done", out))
        self.counts["served"] += 1
        log.info("%s: %d + %d tokens, %.1f tok/s, acceptance length %s, queued %.2f s", job.id,
                 out.stats.prompt_tokens, len(out.token_ids), out.stats.tokens_per_second,
                 out.stats.mean_acceptance_length, job.queue_seconds)
        return True



# ---------------------------------------------------------------------- responses
@dataclass(frozen=True)
class _Reply:
    """Builds the response objects of one request (same id and creation time in every chunk)."""
    request: Request
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, choices: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.request.chat else "text_completion"
        if stream and self.request.include_usage:
            extra.setdefault("usage", None)  # as OpenAI: null in every chunk but the last
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def chunk(self, text: str | None, finish: str | None = None, **delta: str) -> dict[str, Any]:
        """A stream chunk carrying `text` (chat: in `delta`, with any extra delta fields) or a finish reason."""
        if self.request.chat:
            choice = {"index": 0, "delta": delta | ({} if text is None else {"content": text})}
        else:
            choice = {"index": 0, "text": text or ""}
        return self.envelope([choice | {"logprobs": None, "finish_reason": finish}], stream=True)

    def final_chunk(self, out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
        return self.chunk(None, out.finish_reason) | {"blockdraft": _extension(out, queue_seconds)}

    def usage_chunk(self, out: GenerationOutput) -> dict[str, Any]:
        return self.envelope([], stream=True, usage=_usage(out))

    def complete(self, out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
        """The whole (non-stream) response."""
        if self.request.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out.text}}
        else:
            choice = {"index": 0, "text": out.text}
        choice |= {"logprobs": None, "finish_reason": out.finish_reason}
        return self.envelope([choice], stream=False, usage=_usage(out),
                             blockdraft=_extension(out, queue_seconds))


def _usage(out: GenerationOutput) -> dict[str, int]:
    """Token counts: completion tokens are every token the target committed (a stop string may cut text)."""
    prompt, completion = out.stats.prompt_tokens, len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extension(out: GenerationOutput, queue_seconds: float) -> dict[str, Any]:
    """Our stats, small: mean acceptance length (None without drafting), speeds, time spent queued."""
    tau = out.stats.mean_acceptance_length
    return {"acceptance_length": None if tau is None else round(tau, 4),
            "tokens_per_second": round(out.stats.tokens_per_second, 3),
            "decode_tokens_per_second": round(out.stats.decode_tokens_per_second, 3),
            "queue_seconds": round(queue_seconds, 4)}


# ---------------------------------------------------------------------- HTTP
class BlockdraftServer(ThreadingHTTPServer):
    """An HTTP server whose handler threads hand requests to one `Worker` that owns `pipe`.

    `options`: server-wide `Pipeline.stream` keywords that requests cannot set (block_size, no_draft, draft,
    verify, ngram); checked here, before serving. `server_close()` also stops the worker.
    """

    daemon_threads = True
    request_queue_size = 128  # listen backlog: bursts of clients wait for accept() instead of being refused

    def __init__(self, pipe: Pipeline, address: tuple[str, int] = ("127.0.0.1", 8000), *, model_id: str,
                 max_queue: int = DEFAULT_MAX_QUEUE, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 options: dict[str, Any] | None = None, worker_thread: bool = True) -> None:
        self.options = dict(options or {})
        pipe.stream(prompt="check", max_new_tokens=1, **self.options).close()  # validates without decoding
        if pipe.drafter is not None and not self.options.get("no_draft") \
                and self.options.get("verify", "adaptive") == "adaptive":
            pipe.engine.adaptive_policy()  # measure (or load) the verify cost curve now, not in a first request
        self.model_id, self.max_body_bytes = model_id, max_body_bytes
        self.max_tokens = pipe.target.max_positions
        self.worker = Worker(pipe, max_queue, thread=worker_thread)
        self.started = time.time()
        try:
            super().__init__(address, _Handler)
        except OSError:
            self.worker.stop()
            raise

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def serve_here(self) -> None:
        """Answer HTTP from a background thread and run the model on the calling thread (see `Worker`) until
        `server_close` or a Ctrl-C here; needs `worker_thread=False`."""
        if self.worker.thread is not None:
            raise InvalidArgumentError("serve_here runs the worker on this thread: build the server with "
                                       "worker_thread=False")
        threading.Thread(target=self.serve_forever, name="blockdraft-http", daemon=True).start()
        try:
            self.worker.run()
        finally:
            self.shutdown()

    def server_close(self) -> None:
        super().server_close()
        self.worker.stop()


class _Handler(BaseHTTPRequestHandler):
    server: BlockdraftServer
    server_version = "blockdraft"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        """Route one request; every error becomes OpenAI's error JSON, a vanished client is only logged."""
        path = self.path.split("?", 1)[0]
        try:
            if path not in _ROUTES:
                raise ApiError(404, f"path {_show(path)}: expected one of {sorted(_ROUTES)}")
            if _ROUTES[path] != method:
                raise ApiError(405, f"{method} {path}: expected {_ROUTES[path]}", headers={"Allow": _ROUTES[path]})
            if path == "/health":
                self._send_json(200, self._health())
            elif path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [
                    {"id": self.server.model_id, "object": "model", "created": int(self.server.started),
                     "owned_by": "blockdraft"}]})
            else:
                self._complete(chat=path == "/v1/chat/completions")
        except ApiError as exc:
            log.info("%s %s -> %d: %s", method, path, exc.status, exc)
            with suppress(ConnectionError):
                self._send_json(exc.status, exc.body(), exc.headers)
        except ConnectionError:
            log.info("%s %s: client disconnected", method, path)

    def _health(self) -> dict[str, Any]:
        worker = self.server.worker
        counts = {k: worker.counts[k] for k in ("served", "cancelled", "failed")}
        return {"status": "ok", "model": self.server.model_id, "queued": worker.jobs.qsize(),
                "running": worker.current is not None, **counts}

    def _read_json(self) -> Any:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise ApiError(411, f"Content-Length {_show(length)}: expected the JSON body's length in bytes")
        if int(length) > self.server.max_body_bytes:
            raise ApiError(413, f"request body of {length} bytes: expected at most {self.server.max_body_bytes}")
        try:
            return json.loads(self.rfile.read(int(length)))
        except ValueError as exc:
            raise ApiError(400, f"request body is not valid JSON ({exc}): expected one JSON object") from None

    def _complete(self, chat: bool) -> None:
        """Queue a completion, wait for its first event (an error is still a plain HTTP error), answer it."""
        request = parse_request(self._read_json(), chat=chat, model_id=self.server.model_id,
                                max_tokens=self.server.max_tokens)
        reply = _Reply(request, self.server.model_id, ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex)
        job = Job(reply.id, self.server.options | request.kwargs, deltas=request.stream)
        self.server.worker.submit(job)
        event = self._wait(job)
        if event is None:
            return
        if event[0] == "error":
            raise event[1]
        if request.stream:
            self._stream(reply, job, event)
        else:
            self._send_json(200, reply.complete(event[1], job.queue_seconds))

    def _wait(self, job: Job) -> tuple[str, Any] | None:
        """The job's next event; None (and the job cancelled) when the client disconnects meanwhile."""
        while True:
            try:
                return job.events.get(timeout=_POLL_S)
            except queue.Empty:
                if _client_gone(self.connection):
                    job.cancelled.set()
                    log.info("%s: client disconnected while waiting", job.id)
                    return None

    def _stream(self, reply: _Reply, job: Job, event: tuple[str, Any] | None) -> None:
        """Server-sent events: deltas, a finish chunk, the usage chunk if asked, [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            if reply.request.chat:
                self._event(reply.chunk("", role="assistant"))
            while event is not None and event[0] == "delta":
                self._event(reply.chunk(event[1]))
                event = self._wait(job)
            if event is None:
                return
            if event[0] == "error":  # headers are out: the error goes in the stream (no finish_reason)
                self._event(event[1].body())
                return
            self._event(reply.final_chunk(event[1], job.queue_seconds))
            if reply.request.include_usage:
                self._event(reply.usage_chunk(event[1]))
            self.wfile.write(b"data: [DONE]\n\n")
        except ConnectionError:
            job.cancelled.set()
            log.info("%s: client disconnected mid-stream", job.id)

    def _event(self, obj: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _send_json(self, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _client_gone(sock: socket.socket) -> bool:
    """True when the peer has closed its end (a waiting client sends nothing, so a read of 0 bytes means gone)."""
    try:
        return not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:  # still connected, nothing to read
        return False
    except OSError:
        return True
