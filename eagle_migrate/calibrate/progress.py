"""The trainer's per-step records (``train.Progress`` dicts) turned into the library's stage events
(:class:`eagle_migrate.progress.StageProgress`). Imports: progress, train (the Progress type)."""

from __future__ import annotations

from typing import Any

from ..progress import StageProgress
from ..train import Progress


def _al_text(e: dict[str, Any]) -> str:
    """The held-out AL per suite of a ``before`` / ``heldout-eval`` event: ``chat 1.301 long 1.429 ...``."""
    return " ".join(f"{k} {v:.3f}" for k, v in e.items() if isinstance(v, float) and k != "score")


def _train_info(e: dict[str, Any], al_text: str) -> str:
    """One ``train`` event as a progress line: loss, top-1 agreement per draft step, the last held-out AL."""
    acc = "/".join(f"{x:.2f}" for x in e.get("step_acc", []))
    return f"loss {e['loss']:.3f}, top-1 per step {acc}" + (f"; held-out AL {al_text}" if al_text else "")


def progress_adapter(progress: StageProgress | None) -> Progress:
    """The trainer's per-step records -> the library's stage events (``eagle_migrate.progress``): training steps
    carry the loss, per-step top-1 and the last held-out AL as ``info``."""
    if progress is None:
        return lambda e: None
    counts = {"heldout": 0, "eval": 0}
    last_al = {"text": ""}

    def adapt(e: dict[str, Any]) -> None:
        ph = e.get("phase")
        if ph == "train":
            progress("calibrate", e["step"], e["steps"], _train_info(e, last_al["text"]))
        elif ph == "generate":  # the held-out continuations, batch by batch (transformers' generate)
            progress(f"calibrate: {e['stage']}", e["done"], e["total"], e.get("info", ""))
        elif ph == "capture":
            progress("calibrate: target features", e["batch"], e["batches"], "")
        elif ph == "heldout":
            counts["heldout"] += 1
            progress("calibrate: held-out suites", counts["heldout"], None, f"{e['suite']}: {e['sequences']} sequences")
        elif ph in ("before", "heldout-eval"):
            counts["eval"] += 1
            last_al["text"] = _al_text(e)
            progress("calibrate: held-out evaluations", counts["eval"], None, last_al["text"])
    return adapt
