"""Stop a long job at its next safe point: the first SIGINT or SIGTERM asks, a second one interrupts at once.

A training step interrupted half-way (inside the backward pass or the optimizer update) leaves weights that no
checkpoint may hold, so `blockdraft train` used to lose every step since its last checkpoint on Ctrl-C or
SIGTERM. Under `GracefulStop` the first signal only sets `requested`; the loop finishes its step, saves it and
stops. A second signal raises KeyboardInterrupt at once (what Ctrl-C does everywhere else).
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """While active, the first SIGINT / SIGTERM sets `requested` instead of interrupting; a second one raises
    KeyboardInterrupt. `where` says in the log where the job stops (e.g. "the end of this step"). Outside the
    main thread, where Python cannot catch signals, it leaves them alone and `requested` stays False."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.requested = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("%s: stopping at %s; send it again to stop at once", signal.Signals(signum).name, self.where)
