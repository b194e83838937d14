import os
import signal
import threading

import pytest

from blockdraft.train.stopping import GracefulStop


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_asks_and_the_second_interrupts(sig, caplog):
    before = signal.getsignal(sig)
    with GracefulStop("the end of this step") as stop:
        assert not stop.requested
        os.kill(os.getpid(), sig)
        assert stop.requested  # the job goes on to its safe point
        assert f"{signal.Signals(sig).name}: stopping at the end of this step" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


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
