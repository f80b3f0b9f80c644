"""The migrate manifest (``OUT/migrate-manifest.json``): the record of each stage (status, inputs and their hash,
outputs, file hashes, times, gate, error), the hash cache, and how inputs and outputs are written into it.
Imports: pydantic, ``errors`` (redact).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import __version__
from ..errors import redact

MANIFEST_NAME = "migrate-manifest.json"

Status = Literal["pending", "running", "done", "failed"]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----- the manifest ----------------------------------------------------------------------------------------------
class FileHash(BaseModel):
    """Content hash of one file, valid while its size and mtime are unchanged."""

    size: int
    mtime_ns: int
    sha256: str


class StageRecord(BaseModel):
    """What the manifest knows about one stage."""

    model_config = ConfigDict(extra="ignore")

    name: str
    status: Status = Field("pending", description="pending | running | done | failed")
    inputs_hash: str | None = Field(None, description="sha256 over this stage's inputs and the earlier stages' hashes")
    inputs: dict[str, Any] = Field(default_factory=dict, description="the resolved inputs, for people (paths as given)")
    outputs: dict[str, Any] = Field(default_factory=dict, description="what the stage returned (JSON)")
    output_dir: str | None = Field(None, description="the stage's folder, relative to the pipeline folder")
    gate_passed: bool | None = Field(None, description="False: the stage's gate failed and the pipeline stopped")
    message: str | None = Field(None, description="one line from the stage (e.g. the gate's verdict)")
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float | None = None
    error: str | None = Field(None, description="one-line error of the last failed attempt")
    error_type: str | None = None
    exit_code: int | None = None
    attempts: int = Field(0, description="how many times the stage was started")
    files: dict[str, str] | None = Field(None, description="sha256 of every file of the finished stage folder (relative path -> "
                                                             "hex); a re-run verifies them before skipping the stage")
    pid: int | None = Field(None, description="the process running it (status running)")


class Manifest(BaseModel):
    """``OUT/migrate-manifest.json``: one record per stage, in pipeline order."""

    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = 1
    tool: str = "eagle-migrate"
    tool_version: str = __version__
    created_at: str = Field(default_factory=now)
    updated_at: str = Field(default_factory=now)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    hash_cache: dict[str, FileHash] = Field(default_factory=dict, description="absolute file path -> content hash")


# ----- values as the manifest records them ------------------------------------------------------------------------
def display_inputs(v: Any) -> Any:
    """The inputs as people read them in the manifest (credentials in URLs redacted)."""
    if isinstance(v, str):
        return redact(v, tokens=False)
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, Mapping):
        return {str(k): display_inputs(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [display_inputs(x) for x in v]
    return v


def jsonable_outputs(v: Any, tmp: Path, final: Path, base: Path) -> Any:
    """Stage outputs as JSON; paths inside the temporary folder (``Path`` values, or strings naming one) are
    rewritten to their final place, relative to the pipeline folder."""
    if isinstance(v, str) and (v == str(tmp) or v.startswith(str(tmp) + os.sep)):
        v = Path(v)
    if isinstance(v, Path):
        p = v
        with contextlib.suppress(ValueError):
            p = final / v.relative_to(tmp)
        with contextlib.suppress(ValueError):
            return p.relative_to(base).as_posix()
        return str(p)
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, Mapping):
        return {str(k): jsonable_outputs(x, tmp, final, base) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable_outputs(x, tmp, final, base) for x in v]
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)
