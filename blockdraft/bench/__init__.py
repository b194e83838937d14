"""Benchmark harness: prompt sets, the side-by-side runner, metrics, reports and the HTTP load client."""
