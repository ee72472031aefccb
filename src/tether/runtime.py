"""Process-level tuning for CPU runs.

glibc's malloc serves every allocation above its mmap threshold (128 KiB, rising adaptively
with what is freed) with a fresh `mmap` and returns it to the kernel on `free`. PyTorch's CPU
allocator is plain malloc, so each training step's activations (many MB) come back as fresh
pages and every first touch is a page fault that zeroes 4 KiB: measured on the 2-core machine,
~11k faults per RL update of the 3.2M model, and an element-wise multiply into fresh memory 7x
slower than into reused memory (2.8 vs 0.4 ms for 2.8M bf16 elements).

`retain_freed_memory()` raises the mmap threshold to glibc's maximum (32 MiB) and keeps freed
heap memory instead of trimming it, so the next step reuses pages that are already mapped
(faults per update: ~11k -> ~100). Peak RSS is unchanged in principle (the high-water mark is
the same working set; what changes is that it is not handed back between steps).

This is what LD_PRELOAD-ing jemalloc or tcmalloc does for PyTorch CPU training (Intel's tuning
guide recommends either); `mallopt` needs no preload and no extra package. Not glibc (macOS,
musl): a no-op.
"""

from __future__ import annotations

import ctypes

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20

_applied = False


def retain_freed_memory() -> bool:
    """Make glibc malloc keep and reuse freed memory (see the module doc); True when applied."""
    global _applied
    if _applied:
        return True
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except (OSError, TypeError):  # no dlopen(NULL) (Windows)
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                             (_M_TOP_PAD, TOP_PAD)))
    _applied = ok
    return ok
