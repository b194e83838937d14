"""Benchmark harness: metrics, cost accounting and (soon) the side-by-side runner."""
