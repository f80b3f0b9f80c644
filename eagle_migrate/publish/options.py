"""publish's options model: every option of :func:`eagle_migrate.publish.publish` in one checked object (the
checkpoint is its argument; the token is never an option: it is passed to the run or resolved by huggingface_hub,
and never stored). Imports: options (pydantic, through it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..options import Options


class PublishOptions(Options):
    """The options of :func:`eagle_migrate.publish.publish` (documented there). ``repo_id`` None: nothing to
    publish (``migrate`` runs no publish stage; ``publish()`` refuses it)."""

    RUN_FIELDS = {"num_speculative_tokens": "num_speculative_tokens"}  # the run-wide options it takes (options.RunOptions)

    repo_id: Optional[str] = None
    report_dir: Optional[str | Path] = None
    private: bool = False
    create_pr: bool = False
    revision: Optional[str] = None
    dry_run: bool = False
    force: bool = False
    out_dir: Optional[str | Path] = None
    target: Optional[str | Path] = None
    license: Optional[str] = None
    num_speculative_tokens: Optional[int] = None
    forced_by: str = "--force"  # the flag that asked to publish unvalidated, as the card states it
