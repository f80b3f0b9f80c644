"""The library's one progress event: a stage reports ``(stage, done, total, info)``.

Stages (convert, calibrate, ...) call a :class:`StageProgress`; the CLI renders it (``cli/render.StageBar``: a rich bar
on a terminal, ``command: stage done/total (s) info`` lines elsewhere). The trainer's internal per-step records
(``train.Progress``, dicts) are turned into stage events by calibrate, never shown as they are.
"""

from __future__ import annotations

from typing import Protocol


class StageProgress(Protocol):
    def __call__(self, stage: str, done: int, total: int | None, info: str = "") -> None: ...


def no_progress(stage: str, done: int, total: int | None, info: str = "") -> None:  # noqa: ARG001
    return None
