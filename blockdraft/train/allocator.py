"""Keep freed memory in the process on a CPU, so training steps stop faulting fresh pages in.

glibc serves every block over its mmap threshold (at most 32 MiB, raised as blocks are freed) with a fresh
`mmap` and returns it with `munmap` when it is freed, and it trims the heap's top back to the system. A training
step allocates and frees the same large activations and gradients every step, so the kernel maps, zeroes and
faults in ~5 GB of fresh pages a minute. Measured on the campaign's steps (2-core EPYC, docs/figures/train-cpu,
`command.sh heap`): ~137K minor faults a second, 9x fewer with the heap kept, 924 against 820 tok/s over two
ABBA rounds, the same losses to the last digit. The price is that the process keeps its peak memory until it
exits, which suits a training run. Other C libraries are left as they are.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>


def keep_freed_memory() -> bool:
    """Serve every block from the heap and never give its top back (glibc's `mallopt`): freed blocks are reused
    rather than unmapped and faulted in again. True when glibc took both settings; False elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # only glibc has it: another libc's mallopt may mean something else
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt(3): an mmap maximum of 0 serves every block from the heap; a trim threshold of -1 never trims it
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, -1) == 1
    log.info("allocator: freed memory kept in the heap (glibc mallopt): %s", ok)
    return ok
