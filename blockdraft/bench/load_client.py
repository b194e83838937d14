"""Server mode of the benchmark harness: a closed-loop concurrency sweep against an OpenAI-compatible server.

Any server that speaks `/v1/chat/completions` with streaming (ours later, vLLM, SGLang, llama.cpp) can be
measured. For each concurrency c the sweep keeps exactly c requests in flight (closed loop: a new request
is sent the moment one finishes) until `requests_per_level` requests have completed, cycling over the
prompts in a fixed order, so two runs send the same requests in the same order.

Every request streams (`stream: true`, `stream_options.include_usage`), which gives per request:

* latency: seconds from sending the request to the end of the stream (end-to-end, what a user waits);
* TTFT: seconds from sending the request to the first non-empty content delta (queueing + prefill);
* completion tokens: from the final usage chunk; a server that sends no usage falls back to the number
  of content chunks (about one token per chunk; recorded as `token_count: "chunks"`).

A request succeeds only when its stream carries a `finish_reason`: a stream cut short (even one closed
with `[DONE]`) is an error, so truncated answers cannot inflate the request rate.

Per concurrency level, over the level's wall time (first request sent to last one finished):

* output_tokens_per_s: completion tokens of successful requests / wall seconds (the paper's throughput);
* requests_per_s: successful requests / wall seconds;
* latency and TTFT percentiles over successful requests (linear interpolation);
* errors: failed requests (HTTP status, timeout, broken or malformed stream), counted with a short reason.

Failed requests never raise; only a server that cannot be reached at all stops the sweep before it starts.
Results are plain JSON-serialisable dicts; `server_table` renders them like the paper's Table 3.
"""
from __future__ import annotations

import json
import logging
import platform
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Iterable

from tqdm import tqdm

from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)

_MAX_REASON = 80


@dataclass(frozen=True)
class RequestResult:
    """Outcome of one streamed request."""
    ok: bool
    latency: float
    ttft: float | None = None
    tokens: int = 0
    from_usage: bool = False
    error: str = ""
    text: str = ""  # the streamed content, joined


class _StreamError(Exception):
    """A stream that ended early or carried something that is not a chat completion chunk."""


def api_root(base_url: str) -> str:
    """`http://host:port` from a base URL given with or without a trailing `/v1` (and slashes)."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InvalidArgumentError(f"base URL {base_url!r}: expected http://host:port or https://host:port[/v1]")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def percentile(values: Iterable[float], q: float) -> float | None:
    """q-th percentile (0..100) with linear interpolation between order statistics; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _short(reason: object) -> str:
    text = " ".join(str(reason).split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def resolve_model(root: str, model: str | None, api_key: str | None, timeout: float = 10.0) -> str:
    """Check the server answers at all, and pick the first served model when `model` is None.

    Raises a one-line `BlockdraftError` naming the URL when nothing answers (or no model can be chosen).
    """
    url = f"{root}/v1/models"
    request = urllib.request.Request(url, headers=_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            listing = json.load(response)
    except urllib.error.HTTPError as exc:  # the server is up; only the model listing failed
        if model is not None:
            return model
        raise BlockdraftError(f"{url} answered HTTP {exc.code}; pass the model name explicitly") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BlockdraftError(f"no OpenAI-compatible server reachable at {root} ({_short(reason)})") from None
    except ValueError:
        if model is not None:
            return model
        raise BlockdraftError(f"{url} did not return JSON; pass the model name explicitly") from None
    if model is not None:
        return model
    ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict) and m.get("id")]
    if not ids:
        raise BlockdraftError(f"{url} lists no models; pass the model name explicitly")
    return str(ids[0])


def chat_payload(prompt: Prompt, model: str, max_tokens: int, temperature: float) -> bytes:
    body = {"model": model, "messages": [dict(m) for m in prompt.messages], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body).encode()


def _chunk_events(lines: Iterable[bytes]) -> Iterable[dict[str, Any] | None]:
    """Parsed `data:` events of a server-sent-event stream; None for the final `[DONE]`."""
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), `event:` lines
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            yield None
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise _StreamError(f"malformed chunk {_short(data)!r}") from None
        if not isinstance(event, dict):
            raise _StreamError("malformed chunk (not an object)")
        if "error" in event:
            raise _StreamError(f"server error: {_short(event['error'])}")
        yield event


def _read_stream(response: Iterable[bytes], start: float, deadline: float) -> RequestResult:
    ttft: float | None = None
    chunks, usage_tokens, finished, parts = 0, None, False, []
    for event in _chunk_events(response):
        if time.perf_counter() > deadline:
            raise TimeoutError("request exceeded its time limit")
        if event is None:
            break
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            usage_tokens = int(usage["completion_tokens"])
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                chunks += 1
                parts.append(content)
                ttft = time.perf_counter() - start if ttft is None else ttft
            finished = finished or choice.get("finish_reason") is not None
    if not finished:  # e.g. llama-cpp-python cuts a stream short when another request arrives
        raise _StreamError("stream ended without a finish_reason (interrupted)")
    latency = time.perf_counter() - start
    tokens = usage_tokens if usage_tokens is not None else chunks
    return RequestResult(True, latency, ttft, tokens, from_usage=usage_tokens is not None, text="".join(parts))


def send_request(url: str, payload: bytes, headers: dict[str, str], timeout: float) -> RequestResult:
    """One streamed chat completion; every failure becomes a `RequestResult` with a short reason."""
    start = time.perf_counter()
    request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return _read_stream(response, start, start + timeout)
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code}"
    except (TimeoutError, socket.timeout):
        reason = "timeout"
    except _StreamError as exc:
        reason = str(exc)
    except urllib.error.URLError as exc:
        reason = "timeout" if isinstance(exc.reason, TimeoutError) else _short(exc.reason)
    except Exception as exc:  # noqa: BLE001 - a benchmark counts whatever went wrong and carries on
        reason = _short(f"{type(exc).__name__}: {exc}")
    return RequestResult(False, time.perf_counter() - start, error=reason)


def _closed_loop(jobs: list[bytes], url: str, headers: dict[str, str], concurrency: int, timeout: float,
                 bar: tqdm) -> tuple[list[RequestResult], float]:
    """Send `jobs` keeping `concurrency` in flight; results in job order and the wall seconds."""
    queue = iter(enumerate(jobs))
    results: list[RequestResult | None] = [None] * len(jobs)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        def submit(job: tuple[int, bytes]) -> Future:
            future = pool.submit(send_request, url, job[1], headers, timeout)
            future.index = job[0]  # type: ignore[attr-defined]
            return future

        pending = {submit(j) for _, j in zip(range(concurrency), queue)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                results[future.index] = future.result()  # type: ignore[attr-defined]
                bar.update(1)
                following = next(queue, None)
                if following is not None:
                    pending.add(submit(following))
    return [r for r in results if r is not None], time.perf_counter() - start


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summarize_level(concurrency: int, results: list[RequestResult], wall: float) -> dict[str, Any]:
    """The per-level metrics (see the module docstring) from the requests of one concurrency level."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    latencies = [r.latency for r in ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    reasons = Counter(r.error for r in results if not r.ok)
    return {
        "concurrency": concurrency, "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_reasons": dict(reasons.most_common()), "wall_s": round(wall, 4), "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 3) if wall > 0 else None,
        "requests_per_s": round(len(ok) / wall, 4) if wall > 0 else None,
        "latency_p50_s": _rounded(percentile(latencies, 50)), "latency_p95_s": _rounded(percentile(latencies, 95)),
        "latency_p99_s": _rounded(percentile(latencies, 99)),
        "ttft_p50_s": _rounded(percentile(ttfts, 50)), "ttft_p95_s": _rounded(percentile(ttfts, 95)),
        "mean_tokens_per_request": round(tokens / len(ok), 2) if ok else None,
        "token_count": "usage" if ok and all(r.from_usage for r in ok) else ("chunks" if ok else None),
    }


def _check_args(prompts: list[Prompt], concurrencies: list[int], max_tokens: int,
                requests_per_level: int | None, timeout: float) -> None:
    if not prompts:
        raise InvalidArgumentError("server sweep: no prompts to send")
    if not concurrencies or any(not isinstance(c, int) or c < 1 for c in concurrencies):
        raise InvalidArgumentError(f"concurrencies {concurrencies!r}: expected positive integers")
    if max_tokens < 1:
        raise InvalidArgumentError(f"max_tokens {max_tokens}: expected >= 1")
    if requests_per_level is not None and requests_per_level < 1:
        raise InvalidArgumentError(f"requests_per_level {requests_per_level}: expected >= 1")
    if timeout <= 0:
        raise InvalidArgumentError(f"timeout {timeout}: expected > 0 seconds")


def server_sweep(base_url: str, prompts: list[Prompt], concurrencies: list[int], *, model: str | None,
                 max_tokens: int, temperature: float = 0.0, requests_per_level: int | None = None,
                 api_key: str | None = None, timeout: float = 600.0, progress: bool = True,
                 warmup: int = 1, texts: bool = False) -> dict[str, Any]:
    """Closed-loop sweep over `concurrencies` against `{base_url}/v1/chat/completions`.

    `requests_per_level` defaults to max(2 * c, len(prompts)); request i of a level sends prompt
    i mod len(prompts). `warmup` requests (not measured) are sent once before the first level. With `texts`,
    each level also keeps every request's streamed text (in request order; None for a failed one).
    """
    _check_args(prompts, concurrencies, max_tokens, requests_per_level, timeout)
    root = api_root(base_url)
    model = resolve_model(root, model, api_key)
    url, headers = f"{root}/v1/chat/completions", _headers(api_key)
    payloads = [chat_payload(p, model, max_tokens, temperature) for p in prompts]
    log.info("server sweep: %s model=%s concurrencies=%s max_tokens=%d", url, model, concurrencies, max_tokens)
    for i in range(warmup):
        result = send_request(url, payloads[i % len(payloads)], headers, timeout)
        log.info("warm-up request: %s", "ok" if result.ok else f"failed ({result.error})")
    levels = []
    for c in concurrencies:
        n = requests_per_level or max(2 * c, len(prompts))
        jobs = [payloads[i % len(payloads)] for i in range(n)]
        with tqdm(total=n, desc=f"concurrency {c}", unit="req", dynamic_ncols=True, disable=not progress) as bar:
            results, wall = _closed_loop(jobs, url, headers, c, timeout, bar)
        level = summarize_level(c, results, wall)
        if texts:
            level["texts"] = [r.text if r.ok else None for r in results]
        log.info("concurrency %d: %s tok/s, %s req/s, p50 %s s, %d errors", c, level["output_tokens_per_s"],
                 level["requests_per_s"], level["latency_p50_s"], level["errors"])
        levels.append(level)
    return {"base_url": root, "model": model, "max_tokens": max_tokens, "temperature": temperature,
            "requests_per_level": requests_per_level, "prompt_ids": [p.id for p in prompts],
            "warmup_requests": warmup, "client_host": platform.node(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "levels": levels}


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def server_table(results: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    """Markdown table in the shape of the paper's Table 3: one row per concurrency.

    With `baseline` (another sweep, e.g. plain decoding on the same server), adds the baseline's
    throughput and the speed-up (ours / baseline) at the same concurrency.
    """
    base = {lv["concurrency"]: lv for lv in (baseline or {}).get("levels", [])}
    head = ["Concurrency", "Throughput (tok/s)"]
    if baseline is not None:
        head += ["Baseline (tok/s)", "Speedup"]
    head += ["Req/s", "p50 (s)", "p95 (s)", "p99 (s)", "TTFT p50 (s)", "Errors"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for lv in results["levels"]:
        cells = [str(lv["concurrency"]), _fmt(lv["output_tokens_per_s"], 1)]
        if baseline is not None:
            other = base.get(lv["concurrency"], {}).get("output_tokens_per_s")
            ratio = lv["output_tokens_per_s"] / other if other and lv["output_tokens_per_s"] is not None else None
            cells += [_fmt(other, 1), "–" if ratio is None else f"{ratio:.2f}×"]
        cells += [_fmt(lv["requests_per_s"], 3), _fmt(lv["latency_p50_s"], 2), _fmt(lv["latency_p95_s"], 2),
                  _fmt(lv["latency_p99_s"], 2), _fmt(lv["ttft_p50_s"], 2), f"{lv['errors']}/{lv['requests']}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
