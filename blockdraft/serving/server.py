"""OpenAI-compatible HTTP server: FastAPI on uvicorn in front, the continuous-batching scheduler behind.

    POST /v1/chat/completions   messages -> chat.completion (or chat.completion.chunk events)
    POST /v1/completions        prompt   -> text_completion (or text_completion events)
    GET  /v1/models             the served model id
    GET  /health                200 while serving; 503 when the model worker is dead or shutting down
    GET  /metrics               Prometheus text (`blockdraft.serving.metrics`)

uvicorn's event loop runs on a background thread and only parses, queues and writes; the model runs on the
thread that calls `serve()` (the main one: torch drives a model fastest from the thread that ran it, see
docs/serve.md), in `Scheduler.run`. Events cross over through `loop.call_soon_threadsafe` onto one asyncio
queue per request, so the scheduler never waits for a client. SIGTERM / Ctrl-C drain: no new requests
(503), the admitted ones finish within `drain_timeout`, the rest end with a 503 error, then the socket closes.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import socket
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import replace
from typing import Any, AsyncIterator

import h11
import uvicorn
from fastapi import Depends, FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from blockdraft.api import Pipeline
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.serving.metrics import CONTENT_TYPE, ServerMetrics
from blockdraft.serving.protocol import (ApiError, ChatCompletion, ModelList, Reply, Request, TextCompletion,
                                         library_error, parse_json, parse_request, show)
from blockdraft.serving.scheduler import (DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_QUEUE,
                                          DEFAULT_PREFILL_CHUNK, Delta, Done, Event, Failed, Job, QueueFull,
                                          QueueTimeout, Scheduler, ShuttingDown)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20
_POLL_S = 0.25  # how often a request waiting for its first event checks that its client is still there
_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}


class _JsonErrorsH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, answering a request it cannot parse (e.g. a Content-Length that is not a
    number) with OpenAI's error JSON instead of plain text."""

    def send_400_response(self, msg: str) -> None:
        body = ApiError(400, "malformed HTTP request (a bad request line, header or Content-Length): expected "
                             "HTTP/1.1 with a numeric Content-Length").body()
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=data),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class BlockdraftServer:
    """The HTTP front end and the scheduler over one `Pipeline`.

    `options`: server-wide `Pipeline.prepare` keywords that requests cannot set (block_size, no_draft, draft,
    verify, ngram, sampler); checked here. The socket is bound at once (`url` is known, port 0 picks one).
    `serve()` runs the model on the calling thread until a signal or `shutdown()`; `start()` runs it on a
    thread of its own (tests, embedding) and returns.
    """

    def __init__(self, pipe: Pipeline, address: tuple[str, int] = ("127.0.0.1", 8000), *, model_id: str,
                 api_key: str | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                 max_model_len: int | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_queue_wait: float | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 drain_timeout: float = DEFAULT_DRAIN_TIMEOUT, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        check = pipe.prepare(prompt="check", max_new_tokens=1, **self.options)  # validates without decoding
        if api_key is not None and not api_key:
            raise InvalidArgumentError("api_key='': expected a non-empty key (or none)")
        self.pipe, self.model_id, self.api_key = pipe, model_id, api_key
        self.max_body_bytes, self.drain_timeout = max_body_bytes, drain_timeout
        limit = min(DEFAULT_MAX_MODEL_LEN, pipe.target.max_positions) if max_model_len is None else max_model_len
        self.scheduler = Scheduler(pipe, max_batch=max_batch, max_model_len=limit, max_queue=max_queue,
                                   max_queue_wait=max_queue_wait, prefill_chunk=prefill_chunk,
                                   verify_tokens=pipe.engine.verify_tokens(check.options))
        self.metrics = ServerMetrics(lambda: len(self.scheduler.waiting), lambda: len(self.scheduler.running))
        self.scheduler.observer = self.metrics
        if pipe.drafter is not None and not self.options.get("no_draft") \
                and self.options.get("verify", "adaptive") == "adaptive":
            self.scheduler.calibrate()  # the verify cost curves, measured (or loaded) now, not in a first request
        self.started = time.time()
        self.draining = threading.Event()
        self.worker_error: BaseException | None = None
        self._worker_alive = False
        self._worker: threading.Thread | None = None
        self.socket = socket.create_server(address, backlog=512)
        config = uvicorn.Config(build_app(self), log_level="warning", http=_JsonErrorsH11, lifespan="off",
                                timeout_keep_alive=30, access_log=False)
        self.http = uvicorn.Server(config)
        self._http_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def healthy(self) -> bool:
        return self._worker_alive and not self.draining.is_set() and self.worker_error is None

    # ------------------------------------------------------------------ running
    def start(self) -> "BlockdraftServer":
        """Serve HTTP and run the scheduler on background threads; returns once both run."""
        self._start_http()
        self._worker = threading.Thread(target=self._run_worker, name="blockdraft-scheduler", daemon=True)
        self._worker_alive = True
        self._worker.start()
        return self

    def serve(self) -> None:
        """Serve HTTP from a background thread and run the model on this one until SIGTERM / SIGINT or
        `shutdown()`; then drain and close."""
        self._start_http()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):  # the handler runs between two bytecodes of the
                previous[sig] = signal.signal(sig, self._on_signal)  # model thread, which may hold the scheduler's lock
        self._worker_alive = True
        try:
            self._run_worker()
        finally:
            self.close()
            for sig, handler in previous.items():  # a later SIGTERM / Ctrl-C must not go to a closed server
                signal.signal(sig, handler)

    def _start_http(self) -> None:
        self._http_thread = threading.Thread(target=self.http.run, kwargs={"sockets": [self.socket]},
                                             name="blockdraft-http", daemon=True)
        self._http_thread.start()
        while not self.http.started:
            if not self._http_thread.is_alive():
                raise RuntimeError("the HTTP server did not start (see the log)")
            time.sleep(0.01)

    def _run_worker(self) -> None:
        try:
            self.scheduler.run()
            # what a drain left when its time ran out (or a stop): answered now, on the thread that owns the
            # rows, also when no shutdown() / close() follows (start() + begin_drain(), as on SIGTERM)
            self.scheduler.cancel_all("server is shutting down")
        except BaseException as exc:
            self.worker_error = exc
            log.exception("the model worker stopped")
            raise
        finally:
            self._worker_alive = False

    def _on_signal(self, signum: int, _frame: object) -> None:
        """First SIGTERM / Ctrl-C: drain; a second one: stop now (what is left gets 503s)."""
        if self.draining.is_set():
            log.warning("second %s: stopping without waiting for the running requests", signal.Signals(signum).name)
            self.scheduler.stop()
        else:
            threading.Thread(target=self.begin_drain, name="blockdraft-drain-start", daemon=True).start()

    def begin_drain(self) -> None:
        """Stop admitting; a helper thread waits for the admitted requests (up to `drain_timeout`), cancels
        the rest and stops the scheduler."""
        if self.draining.is_set():
            return
        self.draining.set()
        self.scheduler.close_admission()
        log.info("draining: %d running, %d waiting (up to %.0f s)", len(self.scheduler.running),
                 len(self.scheduler.waiting), self.drain_timeout)
        threading.Thread(target=self._drain, name="blockdraft-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.scheduler.busy and time.monotonic() < deadline and self._worker_alive:
            time.sleep(0.05)
        self.scheduler.stop()

    def shutdown(self, timeout: float | None = None) -> None:
        """Drain (see `begin_drain`) and close; returns when done."""
        if timeout is not None:
            self.drain_timeout = timeout
        self.begin_drain()
        if self._worker is not None:
            self._worker.join()
        self.close()

    def close(self) -> None:
        """Answer what is left with 503s, stop HTTP, close the socket."""
        self.scheduler.stop()
        self.scheduler.cancel_all("server is shutting down")
        self.http.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(10)
        with suppress(OSError):
            self.socket.close()

    def __enter__(self) -> "BlockdraftServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(timeout=0)

    def describe(self) -> str:
        """The start-up line on memory: rows x tokens and what they hold."""
        s = self.scheduler
        gib = 2**30
        params = self.pipe.memory_report(s.max_model_len)
        weights = params["target_parameters_bytes"] + params.get("drafter_parameters_bytes", 0)
        draft = params.get("drafter_cache_bytes", 0) * s.max_batch
        return (f"--max-batch {s.max_batch} rows x --max-model-len {s.max_model_len} tokens: KV cache "
                f"{s.kv_cache_bytes / gib:.2f} GiB (allocated now) + drafter context caches up to {draft / gib:.2f} "
                f"GiB, weights {weights / gib:.2f} GiB")

    # ------------------------------------------------------------------ requests
    def submit(self, request: Request, reply: Reply, loop: asyncio.AbstractEventLoop) -> tuple[Job, asyncio.Queue]:
        """Queue a parsed request; its events arrive on the returned asyncio queue."""
        if not self.healthy:
            raise ApiError(503, "server is shutting down" if self.draining.is_set() else "the model worker is down")
        try:
            with self.scheduler.text_lock:  # the tokenizer is not safe to use from two threads at once
                prepared = self.pipe.prepare(**(self.options | request.kwargs))
            if not request.max_tokens_given:
                room = self.scheduler.room(len(prepared.prompt_ids))
                prepared = replace(prepared, options=replace(prepared.options, max_new_tokens=room))
        except BlockdraftError as exc:
            raise library_error(exc) from None
        events: asyncio.Queue[Event] = asyncio.Queue()
        job = Job(reply.id, prepared, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), request.stream)
        try:
            self.scheduler.submit(job)
        except QueueFull as exc:
            raise ApiError(429, str(exc), code="queue_full",
                           headers={"Retry-After": str(self.scheduler.retry_after())}) from None
        except ShuttingDown as exc:
            raise ApiError(503, str(exc)) from None
        except BlockdraftError as exc:
            raise library_error(exc) from None
        return job, events


def _error_of(event: Failed) -> ApiError:
    exc = event.error
    if isinstance(exc, (QueueTimeout, ShuttingDown)):
        return ApiError(503, str(exc))
    if isinstance(exc, BlockdraftError):
        return library_error(exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------- the app
def build_app(server: BlockdraftServer) -> FastAPI:
    app = FastAPI(title="blockdraft", version="1", docs_url=None, redoc_url=None)
    app.add_middleware(_CountRequests, metrics=server.metrics)

    def authorized(request: HttpRequest) -> None:
        if server.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {server.api_key}".encode()):
            raise ApiError(401, "missing or wrong API key: expected the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    @app.exception_handler(ApiError)
    async def api_error(request: HttpRequest, exc: ApiError) -> JSONResponse:
        log.info("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
        return JSONResponse(exc.body(), exc.status, exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: HttpRequest, exc: HTTPException) -> JSONResponse:
        path = request.url.path
        if exc.status_code == 405:
            error = ApiError(405, f"{request.method} {path}: expected another method",
                             headers=dict(exc.headers or {}))
        elif exc.status_code == 404:
            error = ApiError(404, f"path {show(path)}: expected one of {sorted(_ROUTES)}")
        else:
            error = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), error.status, error.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: HttpRequest, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(error.body(), 500)

    @app.get("/health")
    def health() -> JSONResponse:
        s = server.scheduler
        status = "ok" if server.healthy else "shutting down" if server.draining.is_set() else "worker down"
        body = {"status": status, "model": server.model_id, "queued": len(s.waiting), "running": len(s.running),
                "max_batch": s.max_batch, **s.counts}
        return JSONResponse(body, 200 if server.healthy else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", response_model=ModelList, dependencies=[Depends(authorized)])
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.model_id, "object": "model",
                                            "created": int(server.started), "owned_by": "blockdraft"}]}

    @app.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=[Depends(authorized)])
    async def chat(request: HttpRequest) -> Any:
        return await _complete(server, request, chat=True)

    @app.post("/v1/completions", response_model=TextCompletion, dependencies=[Depends(authorized)])
    async def completions(request: HttpRequest) -> Any:
        return await _complete(server, request, chat=False)

    return app


async def _read_body(request: HttpRequest, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and int(length) > limit:
        raise ApiError(413, f"request body of {length} bytes: expected at most {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"request body over {limit} bytes: expected at most {limit}")
    return bytes(body)


async def _complete(server: BlockdraftServer, http: HttpRequest, chat: bool) -> Any:
    """Queue a completion, wait for its first event (an error is still a plain HTTP error), then answer."""
    request = parse_request(parse_json(await _read_body(http, server.max_body_bytes)), chat=chat,
                            model_id=server.model_id)
    reply = Reply(request, server.model_id, ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex)
    job, events = server.submit(request, reply, asyncio.get_running_loop())
    first = await _first_event(http, job, events)
    if isinstance(first, Failed):
        raise _error_of(first)
    if not request.stream:
        return reply.complete(first.output, first.queue_seconds)
    return StreamingResponse(_sse(reply, job, events, first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _first_event(http: HttpRequest, job: Job, events: asyncio.Queue) -> Event:
    """The job's next event; cancels the job (and raises CancelledError) when its client leaves meanwhile."""
    try:
        while True:
            try:
                return await asyncio.wait_for(events.get(), _POLL_S)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    log.info("%s: client disconnected while waiting", job.id)
                    raise asyncio.CancelledError
    except BaseException:
        job.cancel()
        raise


async def _sse(reply: Reply, job: Job, events: asyncio.Queue, event: Event) -> AsyncIterator[bytes]:
    """Server-sent events: role chunk (chat), deltas, a finish chunk, the usage chunk if asked, [DONE]."""
    try:
        if reply.request.chat:
            yield _data(reply.chunk("", role="assistant"))
        while isinstance(event, Delta):
            yield _data(reply.chunk(event.text))
            event = await events.get()
        if isinstance(event, Failed):  # headers are out: the error goes in the stream (no finish_reason)
            yield _data(_error_of(event).body())
            return
        assert isinstance(event, Done)
        yield _data(reply.final_chunk(event.output, event.queue_seconds))
        if reply.request.include_usage:
            yield _data(reply.usage_chunk(event.output))
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op once done; frees the row when the client left mid-stream


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _CountRequests:
    """ASGI middleware: counts answered requests by route and status (streams are not buffered)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in _ROUTES else "other"

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
