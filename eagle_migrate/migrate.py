"""``migrate``: inspect -> convert (+ calibration) -> quantize -> validate -> publish, resumable.

Each stage is the library function of its own module, run through ``pipeline.Pipeline`` so that the output folder
holds one manifest (``migrate-manifest.json``) and one subfolder per stage:

    OUT/inspect/inspect.json
    OUT/convert/model/            the EAGLE-3.1 drafter (+ convert.json)
    OUT/quantize/model/           when --quantize is given (+ quantize.json)
    OUT/validate/report/          report.json, report.md, plots
    OUT/publish/repo/             the Hub repo folder (+ publish.json)

A re-run after a failure or a kill skips the finished stages whose inputs are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .pipeline import Pipeline, PipelineResult, Stage, StageContext, StageResult


@dataclass
class MigrateOptions:
    """Everything ``migrate`` forwards to the stages (the CLI maps its flags onto this)."""

    data: str | None = None
    steps: int | None = None
    max_minutes: float | None = None  # the calibration fine-tune's wall-clock budget
    calibrate: bool | None = None  # None: convert's default (on for conversions, off for 3.1 pass-through)
    train: str = "norms"  # what calibration updates (norms | norms+fc | all)
    num_sequences: int = 32
    output_format: str = "vllm"
    quantize: str | None = None
    quantize_fc: bool = False
    validate: bool = False
    engine: str = "auto"
    suites: list[str] | None = None
    prompts_file: str | None = None
    num_prompts: int | None = None
    max_tokens: int | None = None
    k: int = 3
    min_acceptance_length: float | None = None
    max_regression_pct: float | None = None
    publish: str | None = None
    publish_dry_run: bool = False
    private: bool = False
    create_pr: bool = False
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    aux_ids_convention: str | None = None  # --aux-ids-convention: vllm | output-of-layer (None: fingerprint or measurement)
    vllm_python: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _dump(path: Path, obj: Any) -> None:
    data = obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _is_hub_id(spec: str) -> bool:
    """ORG/NAME that is not a local path (publish's base_model must be a Hub id; local targets come from provenance)."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


def build_stages(source: Path, target: str, opts: MigrateOptions) -> list[Stage]:
    """The stage list for one migration (exposed for tests and for the demo)."""
    if opts.publish and not opts.validate and not opts.publish_dry_run:
        raise InputError("--publish needs --validate (a passing report is what publish checks)",
                         "add --validate, or publish later with `eagle-migrate publish --force`")

    def inspect_stage(ctx: StageContext) -> StageResult:
        from .inspect import inspect_checkpoint

        rep = inspect_checkpoint(source, target, aux_ids_convention=opts.aux_ids_convention, device=opts.device)
        _dump(ctx.out / "inspect.json", rep)
        errors = [f"{f.code}: {f.message}" for f in rep.findings if f.severity == "error"]
        return StageResult(
            outputs={"format": rep.format, "producer": rep.producer, "errors": len(errors)},
            gate_passed=not errors,
            message="; ".join(errors)[:300] if errors else f"{rep.format} from {rep.producer}",
        )

    def convert_stage(ctx: StageContext) -> StageResult:
        from .convert import convert

        res = convert(source, target, ctx.out / "model", data=opts.data, num_sequences=opts.num_sequences,
                      output_format=opts.output_format, device=opts.device, dtype=opts.dtype,
                      calibrate=opts.calibrate, steps=opts.steps, train=opts.train, seed=opts.seed,
                      num_speculative_tokens=opts.k, max_minutes=opts.max_minutes,
                      aux_ids_convention=opts.aux_ids_convention)
        _dump(ctx.out / "convert.json", res)
        return StageResult(outputs={"model": "convert/model", "step0_agreement": res.agreement.step0,
                                    "calibration": res.calibration.status, "calibration_required": res.calibration_required},
                           message=f"step-0 agreement {res.agreement.step0}")

    def model_dir(ctx: StageContext) -> Path:
        q = ctx.path("quantize") / "model"
        return q if opts.quantize and q.exists() else ctx.path("convert") / "model"

    def quantize_stage(ctx: StageContext) -> StageResult:
        from .quantize import quantize

        res = quantize(ctx.path("convert") / "model", ctx.out / "model", opts.quantize, target=target, data=opts.data,
                       quantize_fc=opts.quantize_fc, validate="none")
        _dump(ctx.out / "quantize.json", res)
        return StageResult(outputs={"model": "quantize/model", "ratio": res.checkpoint_ratio},
                           message=f"{res.scheme}: {res.checkpoint_ratio:.2f}x smaller")

    def validate_stage(ctx: StageContext) -> StageResult:
        from .validate.api import validate

        rep = validate(model_dir(ctx), target, engine=opts.engine, suites=opts.suites, prompts_file=opts.prompts_file,
                       k=opts.k, baseline=source, min_acceptance_length=opts.min_acceptance_length,
                       max_regression_pct=opts.max_regression_pct, report_dir=ctx.out / "report",
                       num_prompts=opts.num_prompts, max_tokens=opts.max_tokens, seed=opts.seed,
                       vllm_python=opts.vllm_python, device=opts.device)
        table = {s.name: {"new": s.new.acceptance_length, "baseline": s.baseline.acceptance_length if s.baseline else None}
                 for s in rep.suites}
        return StageResult(outputs={"report": "validate/report", "passed": rep.passed, "engine": rep.engine,
                                    "acceptance_length": table},
                           gate_passed=rep.passed, message="; ".join(rep.failures) or "all gates passed")

    def publish_stage(ctx: StageContext) -> StageResult:
        from .publish import publish

        report = ctx.path("validate") / "report" if opts.validate else None
        res = publish(model_dir(ctx), opts.publish, report_dir=report, private=opts.private, create_pr=opts.create_pr,
                      revision=opts.revision, dry_run=opts.publish_dry_run, out_dir=ctx.out / "repo",
                      target=target if _is_hub_id(target) else None,
                      num_speculative_tokens=opts.k, force=not opts.validate)
        _dump(ctx.out / "publish.json", res)
        return StageResult(outputs={"repo": "publish/repo", "repo_id": res.repo_id, "dry_run": res.dry_run,
                                    "commit_url": res.commit_url, "pr_url": res.pr_url},
                           message=("planned " if res.dry_run else "uploaded ") + f"{len(res.files)} files")

    common = {"checkpoint": Path(source), "target": target}
    aux = {"aux_ids_convention": opts.aux_ids_convention} if opts.aux_ids_convention else {}
    stages = [
        Stage("inspect", inspect_stage, {**common, **aux}, "read the checkpoint and check it against the target"),
        Stage("convert", convert_stage, {**common, **aux, "data": opts.data, "steps": opts.steps, "max_minutes": opts.max_minutes, "calibrate": opts.calibrate, "train": opts.train,
                                         "format": opts.output_format, "seed": opts.seed, "n": opts.num_sequences},
              "EAGLE-3.1 structure, norm initialisation, calibration"),
    ]
    if opts.quantize:
        stages.append(Stage("quantize", quantize_stage, {"scheme": opts.quantize, "fc": opts.quantize_fc, "data": opts.data},
                            "compressed-tensors quantization"))
    if opts.validate:
        stages.append(Stage("validate", validate_stage,
                            {**common, "engine": opts.engine, "suites": opts.suites, "k": opts.k,
                             "prompts": Path(opts.prompts_file) if opts.prompts_file else None,
                             "min_al": opts.min_acceptance_length, "max_reg": opts.max_regression_pct,
                             "n": opts.num_prompts, "max_tokens": opts.max_tokens},
                            "acceptance length against the source drafter"))
    if opts.publish:
        stages.append(Stage("publish", publish_stage,
                            {"repo": opts.publish, "dry_run": opts.publish_dry_run, "private": opts.private,
                             "pr": opts.create_pr, "revision": opts.revision},
                            "model card, speculative configs, upload"))
    return stages


def migrate(source: Path | str, target: str, out: Path | str, opts: MigrateOptions | None = None,
            log: Callable[[str], None] | None = None) -> PipelineResult:
    """Run every stage into ``out`` (resuming a previous run there); see the module docstring."""
    opts = opts or MigrateOptions()
    source = Path(source)
    if not source.exists():
        raise InputError(f"{source}: no such checkpoint")
    return Pipeline(Path(out), build_stages(source, target, opts), protect=[source], log=log).run()
