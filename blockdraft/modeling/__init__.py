"""Model code: the drafter, target adapters, the fast path, checkpoint formats and where models come from.

The bottom layer: imports only the shared helpers at the package top (`errors`, `files`), never `decoding`
or a front end.
"""
