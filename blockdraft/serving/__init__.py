"""Serving: the OpenAI-compatible HTTP server over `blockdraft.api.Pipeline`."""
