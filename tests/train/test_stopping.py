import signal
import threading

import pytest

from blockdraft.train import stopping
from blockdraft.train.stopping import GracefulStop


def deliver(sig: int, stop: GracefulStop) -> None:
    """What `sig` does to this process: run the handler installed for it, checked to be `stop`'s. Called here
    rather than sent with os.kill: a handler that failed to install would let the signal kill or interrupt the
    whole test run (real signals reach GracefulStop in the trainer's subprocess tests of test_trainer.py)."""
    handler = signal.getsignal(sig)
    assert getattr(handler, "__self__", None) is stop, handler
    handler(sig, None)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_asks_and_the_second_interrupts(sig, caplog, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    before = signal.getsignal(sig)
    with GracefulStop("the end of this step") as stop:
        assert not stop.requested
        deliver(sig, stop)
        assert stop.requested  # the job goes on to its safe point
        assert f"{signal.Signals(sig).name}: stopping at the end of this step" in caplog.text
        clock[0] += stopping.ECHO_SECONDS / 2
        deliver(sig, stop)  # the same request again (torchrun passing it on, Ctrl-C to the process group)
        clock[0] += stopping.ECHO_SECONDS
        with pytest.raises(KeyboardInterrupt):
            deliver(sig, stop)
    assert signal.getsignal(sig) is before


def test_a_handler_not_set_from_python_comes_back_as_the_default(monkeypatch):
    installed = {}
    monkeypatch.setattr(stopping.signal, "signal", lambda sig, handler: installed.setdefault(sig, []).append(handler))
    with GracefulStop("x"):
        pass
    assert all(handlers[-1] is signal.SIG_DFL for handlers in installed.values())  # signal() gave None


def test_handlers_come_back_when_the_block_raises():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError):
        with GracefulStop("x"):
            raise ValueError("boom")
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_signals_are_left_alone():
    seen = {}

    def body() -> None:
        with GracefulStop("x") as stop:
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            seen["requested"] = stop.requested

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"handler": before, "requested": False}
