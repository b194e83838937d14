"""The server's Prometheus metrics (`blockdraft.serving.metrics`), fed directly (tests/serving/test_server.py
scrapes them over HTTP)."""
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from blockdraft.serving.metrics import ServerMetrics


def samples(metrics: ServerMetrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}


def test_cycles_count_by_source_and_only_drafted_ones_have_an_acceptance_length():
    queue = [3]
    metrics = ServerMetrics(lambda: queue[0], lambda: 2)
    metrics.cycle(2, [4, 1], [0, None])  # a drafter row and a plain row in one verify
    metrics.cycle(1, [3], [5])  # a looked-up draft after a 5-token match
    metrics.requests.labels("/v1/completions", "200").inc()
    queue[0] = 1
    got = samples(metrics)
    assert got[("blockdraft_cycles_total", (("source", "drafter"),))] == 1
    assert got[("blockdraft_cycles_total", (("source", "plain"),))] == 1
    assert got[("blockdraft_cycles_total", (("source", "lookup"),))] == 1
    assert got[("blockdraft_acceptance_length_count", ())] == 2 and got[("blockdraft_acceptance_length_sum", ())] == 7
    assert got[("blockdraft_cycle_rows_count", ())] == 2 and got[("blockdraft_cycle_rows_sum", ())] == 3
    assert got[("blockdraft_queue_depth", ())] == 1 and got[("blockdraft_running_rows", ())] == 2  # read when scraped
    assert got[("blockdraft_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 1


def test_a_finished_request_counts_its_tokens_and_latencies():
    metrics = ServerMetrics(lambda: 0, lambda: 0)
    job = SimpleNamespace(arrived=0.0, first_token=None)
    metrics.first_token(job, 0.2)
    job.first_token = 0.0
    output = SimpleNamespace(stats=SimpleNamespace(prompt_tokens=7), token_ids=[1, 2, 3])
    metrics.finished(job, output)
    got = samples(metrics)
    assert got[("blockdraft_prompt_tokens_total", ())] == 7 and got[("blockdraft_generation_tokens_total", ())] == 3
    assert got[("blockdraft_time_to_first_token_seconds_sum", ())] == 0.2
    for name in ("blockdraft_e2e_request_latency_seconds", "blockdraft_time_per_output_token_seconds"):
        assert got[(f"{name}_count", ())] == 1
