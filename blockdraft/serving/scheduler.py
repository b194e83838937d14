"""Continuous batching for the server: which requests run, in which cache rows, and when (the engine computes).

    submit(job)  -> the waiting queue (bounded: QueueFull; too long for a row: InvalidArgumentError)
    step():  waiting jobs that were cancelled or waited past `max_queue_wait` leave the queue
             running jobs that were cancelled leave their rows
             waiting jobs take free rows; at most `prefill_chunk` prompt tokens are prefilled (long prompts
               go a chunk per step), so a new prompt never freezes running streams for longer than that
             one decode cycle for every prefilled row (`Batch.cycle`: one verify forward for all of them)
             each job's text deltas go to its sink; finished rows are freed at once

One thread drives the scheduler (`run`): torch models are not safe to use from several. Sinks are called on
that thread and must not block (the server's put events on its event loop's queues), so a slow client never
stalls the others. Each job has its own sampling parameters, stop strings and ids, token limit and text
assembler, so its tokens are those it would get alone (`blockdraft.decoding.batch_engine`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Union

import torch

from blockdraft.api import GenerationOutput, Pipeline, Prepared, TextAssembler
from blockdraft.decoding.batch_engine import Batch
from blockdraft.decoding.engine import DecodeState
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from blockdraft.modeling.fast_target import FastTarget

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_MAX_QUEUE = 64
DEFAULT_PREFILL_CHUNK = 256
DEFAULT_DRAIN_TIMEOUT = 30.0  # seconds admitted requests get to finish on SIGTERM (the server's drain)
_IDLE_WAIT_S = 0.05  # how long an idle scheduler sleeps between checks (a submit wakes it at once)


class QueueFull(BlockdraftError):
    """`max_queue` requests already wait for a row."""


class QueueTimeout(BlockdraftError):
    """A request waited longer than `max_queue_wait` seconds for a row."""


class ShuttingDown(BlockdraftError):
    """The scheduler stopped admitting requests, or cancelled the ones left at the end of a drain."""


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Done:
    output: GenerationOutput
    queue_seconds: float


@dataclass(frozen=True)
class Failed:
    error: Exception


Event = Union[Delta, Done, Failed]


@dataclass
class Job:
    """One request. The scheduler sends its sink Delta events (with `stream`), then Done, or Failed at any
    point; `cancel()` (its client left) frees its row within one step."""
    id: str
    request: Prepared
    sink: Callable[[Event], None]
    stream: bool = True
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set by the scheduler
    state: DecodeState | None = None
    text: TextAssembler | None = None
    row: int | None = None
    admitted: float | None = None
    first_token: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()


class SchedulerObserver:
    """What a scheduler reports as it works (the server's metrics); every method is a no-op here."""

    def cycle(self, rows: int, committed: list[int], sources: list[int | None]) -> None:
        """One decode cycle over `rows` rows: tokens each row committed, and what drafted them (None: a plain
        step, 0: the drafter, n > 0: a lookup after an n-token match)."""

    def first_token(self, job: Job, seconds: float) -> None:
        """`seconds` from arrival to the job's first token."""

    def finished(self, job: Job, output: GenerationOutput) -> None:
        """A job that ran to its end."""


class Scheduler:
    def __init__(self, pipe: Pipeline, *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_model_len: int = DEFAULT_MAX_MODEL_LEN, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_queue_wait: float | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 observer: SchedulerObserver | None = None, verify_tokens: int | None = None) -> None:
        """`verify_tokens`: the most tokens one verify forward of the requests holds (`SpeculativeEngine.verify_tokens`
        of their options), when it can pass the engine's `verify_range` (a fixed-verify tree of over 32 nodes): the
        rows' cache is sized for it at once, rather than doubled the first time a request reaches its end."""
        for name, value in (("max_batch", max_batch), ("max_model_len", max_model_len), ("max_queue", max_queue),
                            ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name}={value!r}: expected an integer >= 1")
        if max_model_len > pipe.target.max_positions:
            raise InvalidArgumentError(f"max_model_len={max_model_len}: expected at most the target's context "
                                       f"of {pipe.target.max_positions} tokens")
        if max_queue_wait is not None and not (isinstance(max_queue_wait, (int, float)) and max_queue_wait > 0):
            raise InvalidArgumentError(f"max_queue_wait={max_queue_wait!r}: expected a number of seconds > 0")
        self.pipe, self.engine = pipe, pipe.engine
        self.max_model_len, self.max_queue, self.max_queue_wait = max_model_len, max_queue, max_queue_wait
        self.prefill_chunk = prefill_chunk
        self.observer = observer or SchedulerObserver()
        verify = self.engine.verify_range if pipe.drafter is not None else 1  # a block of drafts or a tree
        verify = max(verify, verify_tokens or 1)
        if max_batch > 1 and not isinstance(pipe.target, FastTarget):
            log.info("%s has no fast path (Llama / Qwen2 / Qwen3): its %d rows take turns in each cycle's verify",
                     type(pipe.target.model).__name__, max_batch)
        self.batch = Batch(self.engine, max_batch, capacity=max_model_len + verify + 1)
        self.waiting: deque[Job] = deque()
        self.running: dict[int, Job] = {}  # row -> job
        self.accepting = True
        self._lock = threading.Lock()
        self.text_lock = threading.Lock()  # the tokenizer: held here to detokenize, by the server to encode
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "expired": 0}

    @property
    def max_batch(self) -> int:
        return self.batch.rows

    @property
    def kv_cache_bytes(self) -> int:
        cache = self.batch.cache
        return cache.nbytes() if hasattr(cache, "nbytes") else 0

    def calibrate(self) -> None:
        """Measure (or load) the verify cost curves the adaptive policy prices batches with: one row and the
        powers of two up to `max_batch` (interpolated in between), before the first request."""
        if self.pipe.drafter is None:
            return
        self.engine.adaptive_policy()
        sizes = sorted({r for r in (2, 4, 8, 16, 32, 64) if r < self.max_batch} | {self.max_batch})
        for rows in sizes:
            if rows > 1 and self.batch.batched:
                self.engine.calibrate_batch(rows)

    # ------------------------------------------------------------------ requests
    def submit(self, job: Job) -> None:
        """Queue `job`; raises ShuttingDown, QueueFull, or InvalidArgumentError when it cannot fit in a row."""
        self._check_fits(job.request)
        with self._lock:
            if not self.accepting:
                raise ShuttingDown("server is shutting down: not admitting requests")
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"server busy: {len(self.waiting)} requests already wait for one of "
                                f"{self.max_batch} rows (--max-queue {self.max_queue}); retry later")
            self.waiting.append(job)
        self._wake.set()

    def _check_fits(self, request: Prepared) -> None:
        prompt, limit = len(request.prompt_ids), self.max_model_len
        if prompt >= limit:
            raise InvalidArgumentError(f"prompt has {prompt} tokens: expected fewer than --max-model-len {limit}")
        room = limit - prompt
        if request.options.max_new_tokens > room:
            raise InvalidArgumentError(f"max_tokens={request.options.max_new_tokens}: expected at most {room} "
                                       f"(--max-model-len {limit} minus the prompt's {prompt} tokens)")

    def room(self, prompt_tokens: int) -> int:
        """How many new tokens a prompt of `prompt_tokens` leaves in a row (the default max_tokens)."""
        return max(self.max_model_len - prompt_tokens, 1)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one turn of the rows ahead of it (at least 1)."""
        done = [j for j in self.running.values() if j.admitted is not None]
        running_s = max((time.perf_counter() - j.admitted for j in done), default=1.0)
        return max(1, min(60, round(running_s * (1 + len(self.waiting) / self.max_batch))))

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Step until `stop`; sleeps while there is nothing to do."""
        while not self._stopped.is_set():
            if not self.step():
                self._wake.wait(_IDLE_WAIT_S)
                self._wake.clear()

    def stop(self) -> None:
        """End `run` after its current step (jobs left are not answered: see `drain`)."""
        self._stopped.set()
        self._wake.set()

    def close_admission(self) -> None:
        with self._lock:
            self.accepting = False

    def cancel_all(self, reason: str) -> None:
        """Fail every waiting and running job with ShuttingDown(reason) and free their rows."""
        with self._lock:
            waiting, self.waiting = list(self.waiting), deque()
        for job in waiting + list(self.running.values()):
            self._end(job, Failed(ShuttingDown(reason)), "cancelled")

    @torch.inference_mode()
    def step(self) -> bool:
        """One scheduling round; False when there was nothing to do."""
        self._drop_cancelled()
        self._expire_waiting()
        prefilled = self._admit()
        rows = self.batch.decoding_rows()
        if rows:
            self._cycle(rows)
        return prefilled or bool(rows)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.running.values() if j.cancelled.is_set()]:
            log.info("%s: cancelled (client gone), row %d freed", job.id, job.row)
            self._end(job, None, "cancelled")
        with self._lock:
            gone = [j for j in self.waiting if j.cancelled.is_set()]
            for job in gone:
                self.waiting.remove(job)
        self.counts["cancelled"] += len(gone)

    def _expire_waiting(self) -> None:
        if self.max_queue_wait is None:
            return
        limit = time.perf_counter() - self.max_queue_wait
        with self._lock:
            late = [j for j in self.waiting if j.arrived < limit]
            for job in late:
                self.waiting.remove(job)
        for job in late:
            self.counts["expired"] += 1
            self._send(job, Failed(QueueTimeout(f"request waited over --max-queue-wait {self.max_queue_wait:g} s "
                                                f"for one of {self.max_batch} rows; retry later")))

    def _admit(self) -> bool:
        """Free rows take waiting jobs; prefill up to `prefill_chunk` prompt tokens. True if any ran."""
        for row in self.batch.free_rows():
            with self._lock:
                job = self.waiting.popleft() if self.waiting else None
            if job is None:
                break
            self._start(job, row)
        budget, ran = self.prefill_chunk, False
        for row, job in sorted(self.running.items(), key=lambda kv: kv[1].admitted):
            state = job.state
            if budget <= 0 or state.token >= 0:
                continue
            before = state.start
            first = self._guarded(job, lambda: self.batch.prefill(row, chunk=budget))
            ran, budget = True, budget - (state.start - before)
            if first:
                self._emit(job, first)
        return ran

    def _start(self, job: Job, row: int) -> None:
        try:
            job.state = self.engine.begin(job.request.prompt_ids, job.request.options, GenerationStats(1))
        except BlockdraftError as exc:
            self._send(job, Failed(exc))
            return
        job.text = TextAssembler(self.pipe.tokenizer, job.request.stop, job.request.options.stop_token_ids)
        job.row, job.admitted = row, time.perf_counter()
        self.batch.admit(job.state, row)
        self.running[row] = job

    def _cycle(self, rows: list[int]) -> None:
        jobs = [self.running[r] for r in rows]
        before = [len(j.state.stats.sources) for j in jobs]
        try:
            committed = self.batch.cycle(rows)
        except Exception as exc:  # noqa: BLE001 - a failed forward must not take the server down
            log.exception("decode cycle over rows %s failed", rows)
            for job in jobs:
                self._end(job, Failed(exc), "failed")
            return
        self.observer.cycle(len(rows), [len(committed[r]) for r in rows],
                            [j.state.stats.sources[-1] if len(j.state.stats.sources) > n else None
                             for j, n in zip(jobs, before)])
        for r, job in zip(rows, jobs):
            self._emit(job, committed[r])

    def _guarded(self, job: Job, work: Callable[[], list[int]]) -> list[int]:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001
            log.exception("%s: prefill failed", job.id)
            self._end(job, Failed(exc), "failed")
            return []

    def _emit(self, job: Job, committed: list[int]) -> None:
        """Pass a job's new tokens through its text assembler; end it when it stopped or hit its limit."""
        if job.first_token is None:
            job.first_token = time.perf_counter()
            self.observer.first_token(job, job.first_token - job.arrived)
        with self.text_lock:
            delta = job.text.feed(committed)
            ended = job.text.finish_reason == "stop" or job.state.done
            rest = job.text.close() if ended else ""
        if delta and job.stream:
            self._send(job, Delta(delta))
        if ended:
            if rest and job.stream:
                self._send(job, Delta(rest))
            stats = job.state.stats
            stats.new_tokens = len(job.text.tokens)
            output = job.text.output(stats)
            self.observer.finished(job, output)
            log.info("%s: %d + %d tokens, %.1f tok/s, acceptance length %s, queued %.2f s", job.id,
                     stats.prompt_tokens, len(output.token_ids), stats.tokens_per_second,
                     stats.mean_acceptance_length, job.admitted - job.arrived)
            self._end(job, Done(output, job.admitted - job.arrived), "served")

    def _end(self, job: Job, event: Event | None, outcome: str) -> None:
        """Count the outcome, free the job's row and send its last event (counted first: whoever sees the row
        free, on another thread, also sees the count)."""
        self.counts[outcome] += 1
        if job.row is not None and self.running.get(job.row) is job:
            del self.running[job.row]
            self.batch.release(job.row)
        if event is not None:
            self._send(job, event)

    def _send(self, job: Job, event: Event) -> None:
        try:
            job.sink(event)
        except Exception:  # noqa: BLE001 - e.g. the server's event loop is gone: the client cannot be told
            log.debug("%s: could not deliver %s", job.id, type(event).__name__)
            job.cancel()
