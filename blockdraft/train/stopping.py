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
import time
from types import FrameType
from typing import Callable, Union

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ECHO_SECONDS = 1.0  # a second signal this soon is the same request arriving twice (torchrun passes on what it
#                     gets, and Ctrl-C reaches the whole process group), not a second request
Handler = Union[Callable[[int, Union[FrameType, None]], object], int, None]


class GracefulStop:
    """While active, the first SIGINT / SIGTERM sets `requested` instead of interrupting; a second one raises
    KeyboardInterrupt. `where` says in the log where the job stops (e.g. "the end of this step"). Outside the
    main thread, where Python cannot catch signals, it leaves them alone and `requested` stays False. A repeat
    within ECHO_SECONDS counts as the same request."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.requested = False
        self._first = 0.0
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler not set from Python
        self._previous = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            if time.monotonic() - self._first < ECHO_SECONDS:
                return
            raise KeyboardInterrupt
        self.requested, self._first = True, time.monotonic()
        log.warning("%s: stopping at %s; send it again to stop at once", signal.Signals(signum).name, self.where)
