"""The continuous-batching scheduler driven by hand: `step()` on the test thread, sinks that record events."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import pytest

from blockdraft.errors import InvalidArgumentError
from blockdraft.serving.scheduler import (Delta, Done, Failed, Job, QueueFull, QueueTimeout, Scheduler,
                                          SchedulerObserver, ShuttingDown)
from tests.conftest import tiny_pipeline

# prompts whose greedy answers run to their token limit (no stop token before): checked where it matters
LONG = "The quick brown fox jumps over the lazy dog. "
HELD = "hello world"  # its greedy answer runs past 400 tokens (no stop token)


@pytest.fixture(scope="module")
def pipe():
    """Fast-path pair; the scheduler and the reference `generate` calls share it (one thread: this one)."""
    return tiny_pipeline("qwen3", seed=2, fast=True)


class Recorder(SchedulerObserver):
    def __init__(self) -> None:
        self.cycles: list[int] = []  # rows per decode cycle

    def cycle(self, rows: int, committed: list[int], sources: list[int | None]) -> None:
        self.cycles.append(rows)


def make_job(pipe, name: str, log: list[tuple[str, Any]] | None = None, stream: bool = True,
             **kwargs: Any) -> tuple[Job, list]:
    """A job whose events land in its own list (and, named, in a shared `log` when given)."""
    events: list = []

    def sink(event: Any) -> None:
        events.append(event)
        if log is not None:
            log.append((name, event))

    return Job(name, pipe.prepare(**kwargs), sink, stream), events


def done(events: list) -> Done | None:
    last = events[-1] if events else None
    return last if isinstance(last, Done) else None


def step_until(sched: Scheduler, predicate: Callable[[], bool], limit: int = 3000) -> int:
    """Steps taken until `predicate` holds."""
    for n in range(limit):
        if predicate():
            return n
        sched.step()
    raise AssertionError(f"not reached in {limit} steps")


def assert_solo(pipe, events: list, stream: bool = True, **kwargs: Any) -> None:
    """The job's result (and its streamed text) is what `generate` gives the same request alone."""
    out = done(events)
    assert out is not None, events
    expected = pipe.generate(**kwargs)
    assert out.output.token_ids == expected.token_ids
    assert out.output.text == expected.text and out.output.finish_reason == expected.finish_reason
    deltas = "".join(e.text for e in events if isinstance(e, Delta))
    assert deltas == (expected.text if stream else "")


def test_idle_step_does_nothing(pipe):
    sched = Scheduler(pipe, max_batch=2, max_model_len=256)
    assert sched.step() is False and not sched.busy


def test_free_rows_take_waiting_jobs_between_cycles(pipe):
    sched = Scheduler(pipe, max_batch=2, max_model_len=256)
    specs = {"a": dict(prompt="short", max_new_tokens=3), "b": dict(prompt=LONG, max_new_tokens=40),
             "c": dict(prompt="third one", max_new_tokens=12)}
    jobs = {n: make_job(pipe, n, temperature=0.0, **kw) for n, kw in specs.items()}
    for job, _ in jobs.values():
        sched.submit(job)
    assert len(sched.waiting) == 3 and not sched.running
    sched.step()
    assert jobs["a"][0].row == 0 and jobs["b"][0].row == 1 and [j.id for j in sched.waiting] == ["c"]
    step_until(sched, lambda: done(jobs["a"][1]) is not None)
    # a's row was freed by the cycle that finished it; c takes it at the start of the next step, not before
    assert 0 not in sched.running and [j.id for j in sched.waiting] == ["c"] and sched.batch.free_rows() == [0]
    assert done(jobs["b"][1]) is None
    sched.step()
    assert sched.running[0].id == "c" and sched.running[1].id == "b" and not sched.waiting
    step_until(sched, lambda: not sched.busy)
    for name, (_, events) in jobs.items():
        assert_solo(pipe, events, temperature=0.0, **specs[name])
    assert sched.counts == {"served": 3, "cancelled": 0, "failed": 0, "expired": 0}
    assert sched.batch.free_rows() == [0, 1]


def test_one_row_serves_in_arrival_order(pipe):
    sched = Scheduler(pipe, max_batch=1, max_model_len=256)
    log: list = []
    names = ["first", "second", "third", "fourth"]
    jobs = [make_job(pipe, n, log, prompt=f"request {n}", max_new_tokens=6, temperature=0.0) for n in names]
    for job, _ in jobs:
        sched.submit(job)
    seen_running: set[int] = set()
    while sched.busy:
        sched.step()
        seen_running.add(len(sched.running))
    assert seen_running <= {0, 1}
    assert [name for name, event in log if isinstance(event, Done)] == names
    # each job's events all come before the next one's first
    order = [name for name, _ in log]
    assert order == sorted(order, key=names.index)


def test_each_row_keeps_its_own_settings(pipe):
    """Greedy, two seeded samplers, a stop string and a short limit in one batch: each is its solo result."""
    greedy = pipe.generate(prompt=LONG, max_new_tokens=30, temperature=0.0)
    stop = next(greedy.text[i:i + 2] for i in range(4, len(greedy.text) - 2)
                if "\ufffd" not in greedy.text[i:i + 2] and greedy.text[i:i + 2].strip())
    specs = {
        "greedy": dict(prompt=LONG, max_new_tokens=30, temperature=0.0),
        "hot": dict(prompt=LONG, max_new_tokens=30, temperature=1.0, top_p=0.9, seed=7),
        "warm": dict(prompt="abc", max_new_tokens=25, temperature=0.7, top_k=20, seed=3),
        "stopped": dict(prompt=LONG, max_new_tokens=30, temperature=0.0, stop=[stop]),
        "short": dict(prompt="abc", max_new_tokens=4, temperature=0.0),
    }
    recorder = Recorder()
    sched = Scheduler(pipe, max_batch=5, max_model_len=256, observer=recorder)
    jobs = {n: make_job(pipe, n, stream=(n != "short"), **kw) for n, kw in specs.items()}
    for job, _ in jobs.values():
        sched.submit(job)
    step_until(sched, lambda: not sched.busy)
    assert max(recorder.cycles) == 5  # they did share the verify forwards
    for name, (_, events) in jobs.items():
        assert_solo(pipe, events, stream=name != "short", **specs[name])
    assert done(jobs["stopped"][1]).output.finish_reason == "stop"
    assert done(jobs["stopped"][1]).output.text == greedy.text[: greedy.text.find(stop)]
    hot, warm = done(jobs["hot"][1]).output, done(jobs["warm"][1]).output
    assert hot.text != greedy.text  # sampling really happened in that row
    assert len(done(jobs["short"][1]).output.token_ids) == 4 and warm.token_ids


def test_cancelled_jobs_leave_the_queue_and_their_rows(pipe):
    sched = Scheduler(pipe, max_batch=1, max_model_len=256)
    (running, r_events), (waiting, w_events) = (make_job(pipe, n, prompt=HELD, max_new_tokens=200, temperature=0.0)
                                                for n in ("running", "waiting"))
    sched.submit(running)
    sched.submit(waiting)
    sched.step()
    sched.step()
    assert sched.running == {0: running} and list(sched.waiting) == [waiting]
    waiting.cancel()
    sched.step()
    assert not sched.waiting and sched.counts["cancelled"] == 1 and not w_events
    assert sched.running == {0: running}
    seen = len(r_events)
    running.cancel()
    sched.step()
    assert not sched.running and sched.batch.free_rows() == [0] and sched.counts["cancelled"] == 2
    assert len(r_events) == seen and done(r_events) is None  # no more tokens, no Done
    assert sched.step() is False
    # the freed row serves the next request as if fresh
    after, a_events = make_job(pipe, "after", prompt="abc", max_new_tokens=10, temperature=0.0)
    sched.submit(after)
    step_until(sched, lambda: not sched.busy)
    assert_solo(pipe, a_events, prompt="abc", max_new_tokens=10, temperature=0.0)


def test_a_job_that_waited_too_long_expires(pipe):
    sched = Scheduler(pipe, max_batch=1, max_model_len=256, max_queue_wait=30)
    running, r_events = make_job(pipe, "running", prompt=HELD, max_new_tokens=200, temperature=0.0)
    late, l_events = make_job(pipe, "late", prompt="abc", max_new_tokens=5, temperature=0.0)
    fresh, f_events = make_job(pipe, "fresh", prompt="abc", max_new_tokens=5, temperature=0.0)
    for job in (running, late, fresh):
        sched.submit(job)
    sched.step()
    late.arrived = time.perf_counter() - 31  # as if it had waited 31 s
    sched.step()
    [event] = l_events
    assert isinstance(event, Failed) and isinstance(event.error, QueueTimeout)
    assert "--max-queue-wait 30 s" in str(event.error)
    assert list(sched.waiting) == [fresh] and not f_events and sched.counts["expired"] == 1
    assert sched.running == {0: running} and running.state.token >= 0  # the running job carries on


def test_a_full_queue_refuses_more(pipe):
    sched = Scheduler(pipe, max_batch=1, max_model_len=256, max_queue=2)
    jobs = [make_job(pipe, f"j{i}", prompt="abc", max_new_tokens=30, temperature=0.0)[0] for i in range(4)]
    sched.submit(jobs[0])
    sched.submit(jobs[1])
    with pytest.raises(QueueFull, match=r"2 requests already wait for one of 1 rows \(--max-queue 2\)"):
        sched.submit(jobs[2])
    sched.step()  # j0 takes the row: one place left in the queue
    sched.submit(jobs[2])
    with pytest.raises(QueueFull):
        sched.submit(jobs[3])
    assert [j.id for j in sched.waiting] == ["j1", "j2"]


def test_cancel_all_fails_every_job_and_frees_the_rows(pipe):
    sched = Scheduler(pipe, max_batch=2, max_model_len=256)
    jobs = [make_job(pipe, f"j{i}", prompt=HELD, max_new_tokens=100, temperature=0.0) for i in range(3)]
    for job, _ in jobs:
        sched.submit(job)
    sched.step()
    assert len(sched.running) == 2 and len(sched.waiting) == 1
    sched.close_admission()
    with pytest.raises(ShuttingDown, match="not admitting"):
        sched.submit(make_job(pipe, "late", prompt="abc", max_new_tokens=3)[0])
    sched.cancel_all("going away")
    for _, events in jobs:
        assert isinstance(events[-1], Failed) and isinstance(events[-1].error, ShuttingDown)
        assert str(events[-1].error) == "going away"
    assert not sched.busy and sched.batch.free_rows() == [0, 1] and sched.counts["cancelled"] == 3
    assert sched.step() is False


def test_a_request_must_fit_in_a_row(pipe):
    sched = Scheduler(pipe, max_batch=1, max_model_len=32)
    too_long = pipe.prepare(prompt="x" * 40, max_new_tokens=1)
    with pytest.raises(InvalidArgumentError, match="prompt has 40 tokens: expected fewer than --max-model-len 32"):
        sched.submit(Job("a", too_long, lambda e: None))
    too_many = pipe.prepare(prompt="x" * 10, max_new_tokens=23)
    with pytest.raises(InvalidArgumentError, match=r"max_tokens=23: expected at most 22 \(--max-model-len 32 "
                                                   r"minus the prompt's 10 tokens\)"):
        sched.submit(Job("b", too_many, lambda e: None))
    exact, events = make_job(pipe, "c", prompt="x" * 10, max_new_tokens=22, temperature=0.0)
    sched.submit(exact)  # prompt + answer = the whole row
    assert sched.room(10) == 22 and sched.room(40) == 1
    step_until(sched, lambda: not sched.busy)
    assert done(events).output.token_ids == pipe.generate(prompt="x" * 10, max_new_tokens=22).token_ids
    with pytest.raises(InvalidArgumentError, match="max_model_len=513"):
        Scheduler(pipe, max_model_len=513)  # over the target's 512 positions
    for bad in ("max_batch", "max_queue", "prefill_chunk"):
        with pytest.raises(InvalidArgumentError, match=f"{bad}=0"):
            Scheduler(pipe, max_model_len=256, **{bad: 0})
    with pytest.raises(InvalidArgumentError, match="max_queue_wait=-1"):
        Scheduler(pipe, max_model_len=256, max_queue_wait=-1)


def test_a_fixed_verify_tree_past_the_verify_range_gets_its_cache_room_at_once(pipe):
    """A 48-node tree verified whole holds 49 tokens, past the engine's 33: the rows' cache is sized for it when
    the scheduler starts (it was doubled, every row's, when a request first reached its end), and a request
    that decodes up to --max-model-len leaves it as it was; the server sizes it from its own options."""
    from blockdraft.serving.server import BlockdraftServer

    tree = {"tree": 48, "verify": "fixed"}
    job, events = make_job(pipe, "a", prompt=HELD, max_new_tokens=64 - 11, temperature=0.0, **tree)
    assert len(job.request.prompt_ids) == 11  # the whole row: prompt + answer
    need = pipe.engine.verify_tokens(job.request.options)
    assert need == 49 > pipe.engine.verify_range
    sched = Scheduler(pipe, max_batch=2, max_model_len=64, verify_tokens=need)
    capacity = sched.batch.cache.capacity
    assert capacity == 64 + need + 1
    sched.submit(job)
    step_until(sched, lambda: not sched.busy)
    assert done(events).output.token_ids == pipe.generate(prompt=HELD, max_new_tokens=53, **tree).token_ids
    assert sched.batch.cache.capacity == capacity
    with BlockdraftServer(pipe, ("127.0.0.1", 0), model_id="tiny", max_model_len=64, options=tree) as srv:
        assert srv.scheduler.batch.cache.capacity == capacity


def test_long_prompts_prefill_a_chunk_per_step_while_others_decode(pipe):
    recorder = Recorder()
    sched = Scheduler(pipe, max_batch=2, max_model_len=256, prefill_chunk=8, observer=recorder)
    prompt = (LONG * 3)[:100]
    assert len(pipe.encode(prompt)) == 100
    first, f_events = make_job(pipe, "first", prompt="abc", max_new_tokens=150, temperature=0.0)
    sched.submit(first)
    sched.step()
    assert first.state.token >= 0 and recorder.cycles == [1]
    long_job, l_events = make_job(pipe, "long", prompt=prompt, max_new_tokens=20, temperature=0.0)
    sched.submit(long_job)
    pieces: list[tuple[int, int]] = []  # (row, prompt tokens in its cache after the piece)
    prefill = sched.batch.prefill

    def recorded(row: int, chunk: int | None = None) -> list[int]:
        first_token = prefill(row, chunk=chunk)
        pieces.append((row, sched.batch.states[row].start))
        return first_token

    sched.batch.prefill = recorded
    tokens_of_first = []
    while long_job.state is None or long_job.state.token < 0:
        sched.step()
        tokens_of_first.append(len(first.text.tokens))
        assert done(f_events) is None  # the first job is still running: its cycles are what is checked
    assert pieces == [(1, 8 * i) for i in range(1, 13)] + [(1, 100)]  # 13 steps of at most 8 prompt tokens
    # the running job got a decode cycle (at least one more token) in every one of those steps
    assert all(b > a for a, b in zip(tokens_of_first, tokens_of_first[1:]))
    assert recorder.cycles[1:13] == [1] * 12 and recorder.cycles[13] == 2
    step_until(sched, lambda: not sched.busy)
    assert_solo(pipe, l_events, prompt=prompt, max_new_tokens=20, temperature=0.0)
    assert_solo(pipe, f_events, prompt="abc", max_new_tokens=150, temperature=0.0)


def test_a_target_without_the_fast_path_keeps_a_cache_per_row(caplog):
    """Rows take turns in each cycle's verify, each on its own cache: made on admission, freed on release."""
    slow = tiny_pipeline("qwen3", seed=2, fast=False)
    with caplog.at_level(logging.INFO, logger="blockdraft.serving.scheduler"):
        sched = Scheduler(slow, max_batch=4, max_model_len=128)
    assert sched.max_batch == 4 and not sched.batch.batched
    assert "its 4 rows take turns in each cycle's verify" in caplog.text
    jobs = [make_job(slow, n, prompt=f"p {n}", max_new_tokens=8 + 3 * i, temperature=0.0)
            for i, n in enumerate(("a", "b", "c"))]
    for job, _ in jobs:
        sched.submit(job)
    sched.step()
    assert len(sched.running) == 3 and not sched.waiting
    assert sum(c is not None for c in sched.batch.caches) == 3
    step_until(sched, lambda: not sched.busy)
    assert sched.batch.caches == [None] * 4
    for i, (n, (_, events)) in enumerate(zip(("a", "b", "c"), jobs)):
        assert_solo(slow, events, prompt=f"p {n}", max_new_tokens=8 + 3 * i, temperature=0.0)
