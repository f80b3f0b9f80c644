"""Drafter checkpoint layouts: read any of them into one ``Checkpoint``; write the vLLM or speculators layout.

    from eagle_migrate.formats import read_checkpoint, write_checkpoint
    ck = read_checkpoint("./EAGLE3-LLaMA3.1-Instruct-8B")      # SafeAILab, SpecForge, speculators, ModelOpt, ...
    ck.config, ck.producer, ck.format, ck.findings               # DrafterConfig, "safeailab", "eagle3", [...]
    write_checkpoint(ck, "./out", layout="vllm")                  # or layout="speculators"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LAYOUTS, Checkpoint, Finding, Layout, Probe
from .detect import detect_layout, probe_checkpoint, read_checkpoint

if TYPE_CHECKING:
    from .write import ensure_convertible, write_checkpoint

__all__ = [
    "LAYOUTS", "Checkpoint", "Finding", "Layout", "Probe",
    "detect_layout", "ensure_convertible", "probe_checkpoint", "read_checkpoint", "write_checkpoint",
]


def __getattr__(name: str):
    """The writer (and torch behind it) is imported on first use: reading headers (``inspect``) never needs it."""
    if name in ("ensure_convertible", "write_checkpoint"):
        from . import write  # lazy: the writer imports torch; reading (inspect) needs none

        return getattr(write, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
