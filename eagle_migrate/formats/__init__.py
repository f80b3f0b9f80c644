"""Drafter checkpoint layouts: read any of them into one ``Checkpoint``; write the vLLM or speculators layout.

    from eagle_migrate.formats import read_checkpoint, write_checkpoint
    ck = read_checkpoint("./EAGLE3-LLaMA3.1-Instruct-8B")      # SafeAILab, SpecForge, speculators, ModelOpt, ...
    ck.config, ck.producer, ck.format, ck.findings               # DrafterConfig, "safeailab", "eagle3", [...]
    write_checkpoint(ck, "./out", layout="vllm")                  # or layout="speculators"
"""

from __future__ import annotations

from .base import LAYOUTS, Checkpoint, Finding, Layout, Probe
from .detect import detect_layout, probe_checkpoint, read_checkpoint
from .write import ensure_convertible, write_checkpoint

__all__ = [
    "LAYOUTS", "Checkpoint", "Finding", "Layout", "Probe",
    "detect_layout", "ensure_convertible", "probe_checkpoint", "read_checkpoint", "write_checkpoint",
]
