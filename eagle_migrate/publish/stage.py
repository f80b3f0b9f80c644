"""The ``publish`` stage: check the checkpoint and its validation report, plan the repo folder, write it (dry run or
``out_dir``) and upload it in one commit.

Imports: ``errors``, ``formats`` (reader, io, Finding), ``publish.*``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import CheckFailed, CheckpointError, InputError, OutputExistsError, a_an
from ..formats import Checkpoint, read_checkpoint
from ..formats.base import Finding
from ..formats.io import open_checkpoint_path, sha256_files
from ..formats.output import atomic_output_dir
from .folder import RepoPlan, build_folder, is_previous_publish
from .models import REPO_ID, PlannedFile, PublishResult, ValidationStatus
from .options import PublishOptions
from .provenance import describe_checkpoint, resolve_origin
from .report import LoadedReport, gated_verdict, load_report, report_sha
from .serving import (
    TARGET_PLACEHOLDER,
    repo_speculative_config,
    sglang_args,
    vllm_serve_command,
)
from .upload import upload


def _open_source(checkpoint: Path) -> tuple[Path, list[Path], dict[str, Any], Checkpoint]:
    """(folder, weight files, config.json, the reader's Checkpoint) of a publishable EAGLE-3 / 3.1 drafter folder."""
    ckpt = Path(checkpoint)
    folder, weight_files, cfg = open_checkpoint_path(ckpt)
    folder = folder.resolve()
    if ckpt.is_file():
        raise InputError(f"{ckpt}: publish takes the checkpoint folder (config.json + weights)", "pass the folder")
    if cfg is None:
        raise CheckpointError(f"{folder}: no config.json; vLLM cannot load a drafter without it", "publish the output of `eagle-migrate convert`")
    bad = [f.name for f in weight_files if f.suffix != ".safetensors"]
    if bad:
        raise CheckpointError(f"{folder}: {', '.join(bad)} are not safetensors; only safetensors weights are published",
                              "run `eagle-migrate convert` first: it writes safetensors")
    ck = read_checkpoint(folder)
    if ck.config.generation != "eagle3" or not ck.config.supported_architecture:
        raise CheckpointError(f"{folder}: {a_an(ck.format)} drafter ({ck.config.architecture}); publish takes EAGLE-3 / EAGLE-3.1 drafters",
                              "run `eagle-migrate convert` first")
    return folder, weight_files, cfg, ck


def _gate(folder: Path, ck: Checkpoint, report: LoadedReport | None, weights_sha: str, force: bool,
          findings: list[Finding], forced_by: str = "--force") -> str | None:
    """Why the drafter may not be published (None: it may): errors `inspect` finds, no report, a report that did not
    pass or was made for other weights. Refused (raises) unless ``force``; then the reason is recorded.

    Exit codes by kind: a gate of the report that failed is ``CheckFailed`` (exit 1); a refused input is exit 2: a
    drafter `inspect` finds errors in (``CheckpointError``), a report that is missing, records no verdict (nothing was
    gated) or was made for other weights (``InputError``)."""
    errors = [f.message for f in ck.findings if f.severity == "error"]
    reason, gate_failed = None, False  # a refused input (drafter, missing or mismatched report) is exit 2; a failed gate 1
    if errors:
        reason = f"`eagle-migrate inspect` finds errors: {'; '.join(errors[:3])}"
    elif report is None:
        reason = "no validation report (--report DIR)"
    elif report.passed is not True:
        reason, gate_failed = report.reason, report.passed is False  # no verdict: nothing was gated (input, exit 2)
    else:
        rsha = report_sha(report.raw)
        if rsha is None:
            findings.append(Finding(severity="warning", code="report_without_weights_sha256",
                                    message=f"{report.path} does not record the sha256 of the weights it measured "
                                            "(eagle-migrate validate writes weights_sha256): it is trusted as given"))
        elif rsha != weights_sha:
            reason = f"{report.path} was made for other weights (sha256 {rsha[:12]}…, these are {weights_sha[:12]}…)"
    if reason is not None and not force:
        if gate_failed:
            raise CheckFailed(f"refusing to publish {folder}: {reason}",
                              "fix the drafter or the thresholds and re-validate; --force publishes anyway (the card says so)")
        if errors:
            raise CheckpointError(f"refusing to publish {folder}: {reason}",
                                  "fix the drafter (`eagle-migrate inspect` says how; `convert` fixes most); --force publishes anyway")
        raise InputError(f"refusing to publish {folder}: {reason}",
                         "run `eagle-migrate validate CKPT --target T --report DIR` on these weights and pass --report DIR "
                         "(or --force to publish unvalidated: the card says so)")
    if reason is not None:
        findings.append(Finding(severity="warning", code="published_unvalidated",
                                message=f"published with {forced_by}: {reason}"))
    return reason


def _validation_line(report: LoadedReport | None) -> str:
    if report is not None and report.gated:
        n = len(report.info.gates)
        return f"Validation: passed ({'1 gate' if n == 1 else f'all {n} gates'})."
    return "Validation: measured, no acceptance gate set."


def _write_out_dir(plan: RepoPlan, out: Path, say: Callable[[str], None]) -> list[tuple[PlannedFile, Path]]:
    if out.exists() and not is_previous_publish(out):
        raise OutputExistsError(f"{out} exists and is not an earlier publish folder", "choose another --out, or delete it")
    say(f"writing the repo folder {out}")
    inputs = [plan.folder] + ([plan.report.path.parent] if plan.report else [])
    with atomic_output_dir(out, force=True, inputs=inputs) as tmp:
        planned_tmp = build_folder(plan, tmp, link_weights=False)
    return [(p, out / p.path) for p, _ in planned_tmp]


def publish(checkpoint: Path, repo_id: str | None = None, *, token: str | None = None,
            progress: Callable[[str], None] | None = None, **options: Any) -> PublishResult:
    """Build the repo folder for ``checkpoint`` and (unless ``dry_run``) upload it to ``repo_id`` in one commit.

    ``out_dir``: where to write the folder (replaced when it holds an earlier publish folder); default: a temporary
    folder, removed at the end (a dry run without ``out_dir`` writes nothing; an upload sends the weights from the
    checkpoint in place). ``target``: the target's Hub id, or its local folder (then named by its config's
    ``_name_or_path`` or the folder's own name, never the path); with ``license`` it overrides what provenance.json
    and config.json say; ``num_speculative_tokens`` defaults to the report's k, else 3. ``force`` publishes without
    a passing validation report; ``forced_by`` is the flag that asked for it, as the card states it (``--force``,
    or ``--no-validate`` from ``migrate``). The keyword form of :func:`run` with ``PublishOptions.of(**options)``.
    """
    return run(checkpoint, PublishOptions.of(repo_id=repo_id, **options), token=token, progress=progress)


def run(checkpoint: Path, opts: PublishOptions, *, token: str | None = None,
        progress: Callable[[str], None] | None = None) -> PublishResult:
    """The publish stage with its options model (see :func:`publish`); ``token``: the Hub token (send-only)."""
    repo_id, report_dir, private, create_pr, revision = opts.repo_id, opts.report_dir, opts.private, opts.create_pr, opts.revision
    dry_run, force, out_dir, target, license = opts.dry_run, opts.force, opts.out_dir, opts.target, opts.license
    num_speculative_tokens, forced_by = opts.num_speculative_tokens, opts.forced_by
    report_dir = Path(report_dir) if report_dir is not None else None
    say = progress or (lambda msg: None)
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id):
        raise InputError(f"--repo-id {repo_id!r} is not ORG/NAME", "e.g. --repo-id my-org/llama31-8b-eagle3.1")
    if revision is not None and (not revision.strip() or revision.startswith("refs/pr/")):
        raise InputError(f"--revision {revision!r} is not a branch name", "pass a branch (created if missing), or --create-pr")
    folder, weight_files, cfg, ck = _open_source(checkpoint)
    desc = describe_checkpoint(ck)
    findings: list[Finding] = list(ck.findings)
    weights_sha = sha256_files(weight_files)
    report = load_report(report_dir) if report_dir is not None else None
    reason = _gate(folder, ck, report, weights_sha, force, findings, forced_by)
    forced = reason is not None
    origin = resolve_origin(folder, cfg, report.model.target if report else None, target, license, findings)
    k = num_speculative_tokens or (report.model.num_speculative_tokens if report else None) or 3
    plan = RepoPlan(repo_id=repo_id, folder=folder, weight_files=weight_files, weights_sha=weights_sha, drafter=desc,
                    origin=origin, report=report, forced=forced, reason=reason, k=k,
                    spec=repo_speculative_config(repo_id, k), forced_by=forced_by)
    base_model = origin.base_model
    kind = "EAGLE-3.1" if desc["format"] == "eagle3.1" else "EAGLE-3"
    commit_message = f"Upload {kind} drafter" + (f" for {base_model}" if base_model else "") + f" (eagle-migrate {__version__})"
    common = dict(
        repo_id=repo_id, private=private, create_pr=create_pr, revision=revision, commit_message=commit_message,
        base_model=base_model, license=origin.license, format=desc["format"], num_speculative_tokens=k,
        target_name=origin.target_name,
        speculative_config=plan.spec,
        vllm_serve=vllm_serve_command(base_model or origin.target_name or TARGET_PLACEHOLDER, plan.spec),
        sglang_args=sglang_args(repo_id, k), findings=findings, not_uploaded=plan.not_uploaded(),
        validation=ValidationStatus(report=str(report.path) if report else None, measured=report is not None,
                                    passed=gated_verdict(report), gates=len(report.info.gates) if report else 0, forced=forced,
                                    forced_by=forced_by if forced else None, reason=reason),
    )
    planned = _write_out_dir(plan, Path(out_dir), say) if out_dir is not None else []
    if dry_run:
        if out_dir is None:  # nothing is written: the plan is built in a temporary folder and removed
            with tempfile.TemporaryDirectory(prefix="eagle-migrate-publish-") as tmpdir:
                planned = build_folder(plan, Path(tmpdir), link_weights=True)
        return PublishResult(dry_run=True, out_dir=str(out_dir) if out_dir is not None else None,
                             files=[p for p, _ in planned], total_bytes=sum(p.size for p, _ in planned), **common)

    description = (
        f"Made and published with eagle-migrate {__version__}. Weights sha256 {weights_sha}. "
        + (_validation_line(report) if not forced else f"Validation: NOT passed, published with {forced_by} ({reason}).")
    )
    tmp_ctx = tempfile.TemporaryDirectory(prefix="eagle-migrate-publish-") if out_dir is None else contextlib.nullcontext()
    with tmp_ctx as tmpdir:
        if tmpdir is not None:
            planned = build_folder(plan, Path(tmpdir), link_weights=True)
        commit = upload(planned, repo_id, private=private, create_pr=create_pr, revision=revision,
                        commit_message=commit_message, description=description, token=token, say=say,
                        show_bars=progress is not None)
    return PublishResult(dry_run=False, out_dir=str(out_dir) if out_dir is not None else None,
                         files=[p for p, _ in planned], total_bytes=sum(p.size for p, _ in planned), **commit, **common)
