"""The trainer's per-step records (``train.Progress`` dicts) turned into the library's stage events
(:class:`eagle_migrate.progress.StageProgress`). Imports: progress, train (the Progress type)."""

from __future__ import annotations

import time
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


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def eta(started: float, first_step: int, step: int, steps: int, now: float) -> str:
    """The fine-tune's remaining time at ``step`` of the ``steps`` it will reach (the trainer's ``reach``: under a
    wall-clock budget, the steps that fit in it): the mean time per step since ``first_step`` (the step the clock
    started at, a resumed run's first) times the steps left; '' before a step's time is known."""
    done = step - first_step
    if done <= 0 or steps <= step:
        return ""
    return f"ETA {_clock((now - started) / done * (steps - step))}"


def progress_adapter(progress: StageProgress | None) -> Progress:
    """The trainer's per-step records -> the library's stage events (``eagle_migrate.progress``): training steps
    carry the loss, per-step top-1, the last held-out AL and the fine-tune's ETA (:func:`eta`) as ``info``; the bar's
    total is the steps the trainer says it will reach (``reach``: fewer than ``steps`` under a wall-clock budget)."""
    if progress is None:
        return lambda e: None
    counts = {"heldout": 0, "eval": 0}
    last_al = {"text": ""}
    clock: dict[str, float] = {}

    def adapt(e: dict[str, Any]) -> None:
        ph = e.get("phase")
        if ph == "train":
            now = time.perf_counter()
            clock.setdefault("t0", now)  # the clock starts at the first step's record: the ETA from the second on
            clock.setdefault("first", float(e["step"]))
            total = int(e.get("reach", e["steps"]))
            left = eta(clock["t0"], int(clock["first"]), e["step"], total, now)
            progress("calibrate", e["step"], total, _train_info(e, last_al["text"]) + (f"; {left}" if left else ""))
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
