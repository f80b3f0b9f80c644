"""A generic resumable stage runner with one manifest in the output folder (what ``migrate`` and ``demo`` run on).

    pipe = Pipeline(out_dir, [Stage("convert", convert_fn, {"checkpoint": Path(ckpt), "target": "org/name"}),
                              Stage("validate", validate_fn, lambda results: {"min_al": 2.0})])
    result = pipe.run()          # PipelineResult: one JSON summary; result.exit_code from the gates

* Each stage writes into its own subfolder ``OUT/<stage>/`` through ``atomic_output_dir``: the stage function gets
  a temporary sibling folder (``ctx.out``) that is renamed into place only when the function returns, so a kill
  never leaves a half-written stage folder behind.
* ``OUT/migrate-manifest.json`` (pydantic ``Manifest``) records per stage: the inputs hash, the inputs, the outputs,
  the status (pending | running | done | failed), started/finished times, the gate result and the error. It is
  rewritten atomically (temporary file, fsync, ``os.replace``) at every state change.
* A re-run skips a stage whose record is ``done`` with an unchanged inputs hash and whose folder still holds
  exactly the files, with the sha256, recorded when it finished (``StageRecord.files``), and resumes
  at the first stage that is not (failed, interrupted, killed, new inputs). The inputs hash covers the stage's own
  inputs (``Path`` values by content: sha256, cached in the manifest by size + mtime; pass a ``str`` to hash a name
  only) and the inputs and file hashes of every earlier stage, so a stage whose upstream ran with different inputs
  or wrote different files runs again. ``run(force_stage=NAME)`` re-runs NAME and every later stage.
* Gates: a stage returns ``StageResult(gate_passed=False, message=...)`` to keep its output (e.g. a report) and stop
  the pipeline with exit code 1; raising ``CheckFailed`` does the same without keeping the output. Any other
  ``EagleMigrateError`` stops it with that error's exit code. SIGTERM / SIGINT mark the running stage failed
  ("interrupted") and the result's exit code is 128 + signal; SIGKILL leaves it ``running``, which a re-run treats
  the same way. Stage functions must be deterministic in their inputs for skipping to be sound.
"""

from __future__ import annotations

from .hashing import folder_sha256
from .manifest import MANIFEST_NAME, FileHash, Manifest, StageRecord, Status
from .runner import (
    LOCK_NAME,
    Action,
    Interrupted,
    Pipeline,
    PipelineResult,
    Stage,
    StageContext,
    StageResult,
    StageSummary,
)

__all__ = ["LOCK_NAME", "MANIFEST_NAME", "Action", "FileHash", "Interrupted", "Manifest", "Pipeline", "PipelineResult",
           "Stage", "StageContext", "StageRecord", "StageResult", "StageSummary", "Status", "folder_sha256"]
