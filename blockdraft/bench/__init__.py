"""Benchmark harness: prompt sets, the side-by-side runner, metrics, reports, the HTTP load client and the servers
it starts and sweeps."""
