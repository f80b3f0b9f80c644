"""The resumable stage runner: stages and their context, the lock, stale temporary folders, signals, and
:class:`Pipeline` (run, skip, resume, gates) over one manifest.
Imports: pydantic, ``errors``, ``formats.output``, ``pipeline.manifest`` / ``hashing``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from .. import __version__
from ..errors import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EagleMigrateError,
    InputError,
    Interrupted,
    OutputExistsError,
    sigterm_raises,
)
from ..formats.output import atomic_output_dir, atomic_write_text, check_no_overlap, check_writable_parent
from .hashing import Hasher, files_changed, files_digest, folder_sha256, inputs_digest
from .manifest import MANIFEST_NAME, Manifest, StageRecord, Status, display_inputs, jsonable_outputs, now

LOCK_NAME = ".migrate.lock"
_STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_STALE = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)(?:-[0-9a-f]+)?$")

Action = Literal["ran", "skipped", "not-run"]


# ----- stages ----------------------------------------------------------------------------------------------------
class StageResult(BaseModel):
    """What a stage function may return (a plain dict means ``StageResult(outputs=dict)``)."""

    outputs: dict[str, Any] = Field(default_factory=dict)
    gate_passed: bool | None = Field(None, description="False keeps the output and stops the pipeline with exit 1")
    message: str | None = None


@dataclass
class StageContext:
    """Handed to a stage function."""

    name: str
    out: Path  # temporary folder: write everything here; it becomes ``final_dir`` when the function returns
    final_dir: Path
    pipeline_dir: Path
    inputs: dict[str, Any]
    results: dict[str, dict[str, Any]]  # outputs of the earlier stages, by name
    log: Callable[[str], None]

    def path(self, stage: str) -> Path:
        """The folder of an earlier stage."""
        return self.pipeline_dir / stage


InputsSpec = Mapping[str, Any] | Callable[[dict[str, dict[str, Any]]], Mapping[str, Any]]


@dataclass(frozen=True)
class Stage:
    """One step: ``fn(ctx) -> StageResult | dict | None``; ``inputs`` (or a function of the earlier outputs) is
    hashed to decide whether a finished stage can be skipped."""

    name: str
    fn: Callable[[StageContext], StageResult | Mapping[str, Any] | None]
    inputs: InputsSpec = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if not _STAGE_NAME.match(self.name):
            raise ValueError(f"stage name {self.name!r} must match {_STAGE_NAME.pattern}")


class StageSummary(BaseModel):
    name: str
    status: Status
    action: Action = Field(..., description="ran in this invocation, skipped (done before, inputs unchanged), or not-run")
    gate_passed: bool | None = None
    message: str | None = None
    error: str | None = None
    seconds: float | None = None
    output_dir: str | None = None
    outputs: dict[str, Any] = Field(default_factory=dict)


class PipelineResult(BaseModel):
    """The one JSON summary for CI."""

    ok: bool
    exit_code: int = Field(..., description="0 ok, 1 a gate/check failed, 2 bad input, 128+N interrupted by signal N")
    out_dir: str
    manifest: str
    failed_stage: str | None = None
    interrupted: bool = False
    hint: str | None = Field(None, description="what to do next when a stage failed")
    tool_version: str = __version__
    stages: list[StageSummary]


def _pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _one_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else e.__class__.__name__)[:500]


# ----- the runner ------------------------------------------------------------------------------------------------
class Pipeline:
    """Runs ``stages`` in order inside ``out_dir``; see the module docstring."""

    def __init__(self, out_dir: Path, stages: list[Stage], *, protect: list[Any] = (), log: Callable[[str], None] | None = None,
                 progress: Callable[[str, int, int | None, str], None] | None = None):
        names = [s.name for s in stages]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate stage names: {', '.join(dup)}")
        self.out_dir = Path(out_dir)
        self.stages = list(stages)
        self.manifest_path = self.out_dir / MANIFEST_NAME
        self._log = log or (lambda msg: None)
        self._progress = progress
        check_no_overlap(self.out_dir, list(protect))
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise InputError(f"{out_dir} exists and is not a folder")
        if self.out_dir.is_dir() and not self.manifest_path.exists() and any(
            not (p.name == LOCK_NAME or _STALE.match(p.name)) for p in self.out_dir.iterdir()
        ):
            raise OutputExistsError(
                f"{out_dir} is a non-empty folder without {MANIFEST_NAME}: not an eagle-migrate run folder",
                "choose a new or empty -o (a run folder is resumed by running the same command again)",
            )
        if not self.out_dir.exists():
            check_writable_parent(self.out_dir)

    # -- manifest ---------------------------------------------------------------------------------------------
    def load_manifest(self) -> Manifest:
        if not self.manifest_path.exists():
            return Manifest()
        try:
            return Manifest.model_validate_json(self.manifest_path.read_text(encoding="utf-8"))
        except (ValidationError, ValueError, OSError) as e:
            raise InputError(
                f"{self.manifest_path}: not a readable eagle-migrate manifest ({_one_line(e)[:200]})",
                f"delete {self.manifest_path} (and the stage folders) to start over, or choose a new -o",
            ) from None

    def _save(self, m: Manifest) -> None:
        m.updated_at = now()
        m.tool_version = __version__
        atomic_write_text(self.manifest_path, m.model_dump_json(indent=2) + "\n")

    # -- housekeeping -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        lock = self.out_dir / LOCK_NAME
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    other = int(lock.read_text().strip() or 0)
                except (OSError, ValueError):
                    other = 0
                if other != os.getpid() and _pid_alive(other):
                    raise InputError(
                        f"another eagle-migrate process (pid {other}) is running in {self.out_dir}",
                        "wait for it to finish, or stop it; a re-run resumes where it stopped",
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # stale: its process is gone (killed)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            break
        else:
            raise InputError(f"cannot take the lock {lock}", f"delete {lock} if no eagle-migrate process runs there")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()

    def _clean_stale(self) -> None:
        """Remove temporary folders/files a killed run left behind (``.<stage>.tmp-PID``, ``.<stage>.old-PID``)."""
        names = {s.name for s in self.stages} | {MANIFEST_NAME}
        for p in self.out_dir.iterdir():
            m = _STALE.match(p.name)
            if not m or m.group("name") not in names:
                continue
            if int(m.group("pid")) != os.getpid() and _pid_alive(int(m.group("pid"))):
                continue
            self._log(f"removing {p.name} left by an interrupted run")
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, *, force: bool = False, force_stage: str | None = None) -> PipelineResult:
        """Run (or resume) the pipeline. ``force`` re-runs every stage; ``force_stage`` re-runs that stage and
        every later one. Never raises for a failing stage: the result carries the exit code (unexpected
        exceptions, i.e. bugs, are recorded and re-raised)."""
        names = [st.name for st in self.stages]
        if force_stage is not None and force_stage not in names:
            raise InputError(f"--force-stage {force_stage!r} is not a stage of this run", f"choose one of {', '.join(names)}")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the output folder {self.out_dir} ({e.strerror or e})", "choose an -o you can write") from None
        with self._lock(), sigterm_raises():
            return self._run(force, force_stage)

    def _run(self, force: bool, force_stage: str | None = None) -> PipelineResult:
        m = self.load_manifest()
        self._clean_stale()
        for rec in m.stages.values():
            if rec.status == "running" and not (rec.pid == os.getpid()):
                rec.status, rec.error, rec.error_type = "failed", f"interrupted (process {rec.pid} stopped without finishing)", "Interrupted"
        # keep the records of this pipeline's stages, in its order
        m.stages = {s.name: m.stages[s.name] for s in self.stages if s.name in m.stages}
        hasher = Hasher(m.hash_cache)
        results: dict[str, dict[str, Any]] = {}
        summaries: list[StageSummary] = []
        chain: list[tuple[str, str, str]] = []
        exit_code, failed, interrupted = EXIT_OK, None, False
        forcing = force

        for stage in self.stages:
            rec = m.stages.get(stage.name)
            forcing = forcing or stage.name == force_stage
            if failed is not None:
                summaries.append(self._summary(rec or StageRecord(name=stage.name), "not-run"))
                continue
            raw_inputs = stage.inputs(results) if callable(stage.inputs) else stage.inputs
            raw_inputs = dict(raw_inputs)
            digest = inputs_digest(hasher, raw_inputs, stage.name, chain)
            final = self.out_dir / stage.name

            if not forcing and rec is not None and rec.status == "done" and rec.inputs_hash == digest and final.is_dir():
                why = files_changed(rec.files, final)
                if why is None:
                    self._log(f"[{stage.name}] done before with the same inputs, files verified: skipped")
                    results[stage.name] = rec.outputs
                    chain.append((stage.name, digest, files_digest(rec.files)))
                    summaries.append(self._summary(rec, "skipped"))
                    if rec.gate_passed is False:
                        exit_code, failed = EXIT_CHECK_FAILED, stage.name
                    continue
                self._log(f"[{stage.name}] not trusted ({why}): running it again")

            rec = StageRecord(
                name=stage.name, status="running", inputs_hash=digest, inputs=display_inputs(raw_inputs),
                started_at=now(), attempts=(rec.attempts if rec else 0) + 1, pid=os.getpid(),
                output_dir=stage.name,
            )
            m.stages[stage.name] = rec
            self._save(m)
            self._log(f"[{stage.name}] running")
            if self._progress is not None:  # the stage in flight, so a progress heartbeat names it
                self._progress(stage.name, 0, None, "")
            t0 = time.perf_counter()
            try:
                with atomic_output_dir(final, force=True) as tmp:
                    ctx = StageContext(
                        name=stage.name, out=tmp, final_dir=final, pipeline_dir=self.out_dir,
                        inputs=raw_inputs, results=dict(results), log=self._log,
                    )
                    got = stage.fn(ctx)
                    res = got if isinstance(got, StageResult) else StageResult(outputs=dict(got or {}))
                    outputs = jsonable_outputs(res.outputs, tmp, final, self.out_dir)
            except EagleMigrateError as e:
                self._fail(m, rec, t0, e.message, e.__class__.__name__, e.exit_code)
                exit_code, failed = e.exit_code, stage.name
                summaries.append(self._summary(rec, "ran"))
                continue
            except KeyboardInterrupt as e:
                signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
                self._fail(m, rec, t0, f"interrupted by signal {signum}", "Interrupted", 128 + int(signum))
                exit_code, failed, interrupted = 128 + int(signum), stage.name, True
                summaries.append(self._summary(rec, "ran"))
                continue
            except Exception as e:
                self._fail(m, rec, t0, f"unexpected {e.__class__.__name__}: {_one_line(e)}", e.__class__.__name__, EXIT_CHECK_FAILED)
                raise
            rec.status, rec.outputs, rec.gate_passed, rec.message = "done", outputs, res.gate_passed, res.message
            rec.finished_at, rec.seconds, rec.pid = now(), round(time.perf_counter() - t0, 3), None
            rec.error = rec.error_type = rec.exit_code = None
            rec.files = folder_sha256(final)
            chain.append((stage.name, digest, files_digest(rec.files)))
            results[stage.name] = outputs
            m.hash_cache = {k: v for k, v in hasher.cache.items() if k in hasher.used or Path(k).exists()}
            self._save(m)
            self._log(f"[{stage.name}] done in {rec.seconds:.1f} s" + (f": {res.message}" if res.message else ""))
            summaries.append(self._summary(rec, "ran"))
            if res.gate_passed is False:
                exit_code, failed = EXIT_CHECK_FAILED, stage.name

        m.hash_cache = {k: v for k, v in hasher.cache.items() if k in hasher.used or Path(k).exists()}
        self._save(m)
        hint = None
        if failed is not None:
            done_before = [st.name for st in summaries if st.action == "skipped"]
            first = done_before[0] if done_before else failed
            hint = (f"fix the cause and run the same command again (it resumes at {failed}); "
                    f"to redo finished stages too: --force-stage {first} (re-runs it and every later stage) or --restart")
        return PipelineResult(
            ok=exit_code == EXIT_OK, exit_code=exit_code, out_dir=str(self.out_dir), manifest=str(self.manifest_path),
            failed_stage=failed, interrupted=interrupted, stages=summaries, hint=hint,
        )

    def _fail(self, m: Manifest, rec: StageRecord, t0: float, error: str, etype: str, code: int) -> None:
        rec.status, rec.error, rec.error_type, rec.exit_code = "failed", error, etype, code
        rec.finished_at, rec.seconds, rec.pid = now(), round(time.perf_counter() - t0, 3), None
        self._save(m)
        self._log(f"[{rec.name}] failed: {error}")

    @staticmethod
    def _summary(rec: StageRecord, action: Action) -> StageSummary:
        return StageSummary(
            name=rec.name, status=rec.status, action=action, gate_passed=rec.gate_passed, message=rec.message,
            error=rec.error if rec.status == "failed" else None, seconds=rec.seconds if action == "ran" else None,
            output_dir=rec.output_dir if rec.status == "done" else None, outputs=rec.outputs if rec.status == "done" else {},
        )
