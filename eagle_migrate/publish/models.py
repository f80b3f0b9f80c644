"""What ``publish`` returns, and the names of the repo folder's files.

Imports: pydantic, ``formats.base`` (Finding).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..formats.base import Finding

REPORT_FILE = "report.json"
SPEC_FILE = "speculative_config.json"
PROVENANCE_FILE = "provenance.json"
VALIDATION_DIR = "validation"
EXTRA_CHECKPOINT_FILES = ("model.safetensors.index.json", "generation_config.json", "recipe.yaml")
MAX_PLOTS = 8
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class PlannedFile(BaseModel):
    path: str = Field(..., description="path inside the repository")
    size: int
    source: Literal["checkpoint", "generated", "report"]


class ValidationStatus(BaseModel):
    report: str | None = Field(None, description="the report.json that was read")
    measured: bool = Field(False, description="a validation report of these weights was read")
    gates: int = Field(0, description="how many gates the report has")
    passed: bool | None = Field(None, description="True only when the report has gates and all passed; None: no gate "
                                "was set (measured only) or no verdict")
    forced: bool = Field(False, description="published without a passing report")
    forced_by: str | None = Field(None, description="the flag that allowed it: --force, or migrate's --no-validate")
    reason: str | None = Field(None, description="why the report does not pass (when it does not)")


class PublishResult(BaseModel):
    """What ``publish`` did (or, with ``dry_run``, would do)."""

    model_config = ConfigDict(frozen=True)

    repo_id: str
    dry_run: bool
    private: bool
    create_pr: bool
    revision: str | None
    commit_message: str
    out_dir: str | None = Field(None, description="the repo folder on disk (None: a temporary folder, removed)")
    files: list[PlannedFile]
    total_bytes: int
    not_uploaded: list[str] = Field(default_factory=list, description="checkpoint files left out on purpose")
    base_model: str | None
    target_name: str | None = Field(None, description="a local target's own name when its hub id is unknown (no path)")
    license: str | None
    format: str
    num_speculative_tokens: int
    speculative_config: dict[str, Any]
    vllm_serve: str
    sglang_args: list[str]
    validation: ValidationStatus
    findings: list[Finding] = Field(default_factory=list)
    repo_url: str | None = None
    commit_url: str | None = None
    commit_oid: str | None = None
    pr_url: str | None = None
