"""Freed memory kept in the heap (`blockdraft.train.allocator`): repeated large blocks stop faulting pages in.

Each case runs in its own interpreter (the setting is process-wide and cannot be undone); the one without it is
the negative control. What it asks of glibc is checked in this process on a fake C library."""
import ctypes
import subprocess
import sys

import pytest

STEPS = """
import resource, sys, torch
if sys.argv[1] == "heap":
    from blockdraft.train.allocator import keep_freed_memory
    assert keep_freed_memory()
def step():  # what a training step does: a large block, written, then freed
    return float(torch.ones(16 << 20)[-1])  # 64 MiB, over glibc's largest mmap threshold
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc only")
def test_kept_heap_reuses_freed_blocks():
    kept, system = _faults("heap"), _faults("system")
    assert kept < system / 4  # the control faults every step's 64 MiB in afresh (163,850 faults here; kept: 16,384)



class FakeLibc:
    """A C library that records `mallopt` calls (this process's real allocator is left alone)."""

    def __init__(self, glibc: bool = True, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer
        if glibc:
            self.gnu_get_libc_version = lambda: b"2.36"

        def mallopt(param: int, value: int) -> int:  # a function: ctypes' argtypes / restype are set on it
            self.calls.append((param, value))
            return self.answer

        self.mallopt = mallopt


@pytest.mark.parametrize("libc, kept", [(FakeLibc(), True), (FakeLibc(answer=0), False),
                                         (FakeLibc(glibc=False), False)])
def test_glibc_is_told_to_serve_every_block_from_the_heap_and_never_trim_it(monkeypatch, libc, kept):
    from blockdraft.train import allocator

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: libc)
    assert allocator.keep_freed_memory() is kept
    if libc.answer and hasattr(libc, "gnu_get_libc_version"):
        assert libc.calls == [(allocator.M_MMAP_MAX, 0), (allocator.M_TRIM_THRESHOLD, -1)]
    if not hasattr(libc, "gnu_get_libc_version"):
        assert libc.calls == []  # another C library's mallopt may mean something else: not called
