"""Process-wide allocator settings (no torch import: the CLI applies them before any command runs)."""

from __future__ import annotations

_MMAP_THRESHOLD_SET = False


def fixed_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Serve every allocation above ``nbytes`` by its own mmap (glibc ``mallopt(M_MMAP_THRESHOLD)``), so freed
    tensors go back to the OS. glibc's default raises the threshold after each large free, after which per-sequence
    temporaries of a few MB land in the heap and fragment it: the 8B-shaped structural conversion's peak RSS grew
    ~20 MiB per statistics sequence and measured 1,915 MiB; with the threshold fixed, 1,561 MiB at the same speed
    (docs/benchmarks.md). The same as ``MALLOC_MMAP_THRESHOLD_=131072``. No-op (False) off glibc; idempotent."""
    global _MMAP_THRESHOLD_SET
    if _MMAP_THRESHOLD_SET:
        return True
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(-3, int(nbytes)))  # M_MMAP_THRESHOLD = -3
    except (OSError, AttributeError):
        return False
    _MMAP_THRESHOLD_SET = ok
    return ok
