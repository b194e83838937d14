"""Decoding: sampling, lossless acceptance, draft proposals (drafter, lookups), verify-length policy, the
solo and batched engines and their statistics.

Builds on `blockdraft.modeling`; never imports a front end (`api`, `cli`, `serving`, `bench`, `train`).
"""
