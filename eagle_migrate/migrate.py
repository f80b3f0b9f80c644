"""``migrate``: inspect -> convert (+ calibration) -> quantize -> validate -> publish, resumable.

Each stage is the library function of its own module, run through ``pipeline.Pipeline`` so that the output folder
holds one manifest (``migrate-manifest.json``) and one subfolder per stage:

    OUT/inspect/inspect.json
    OUT/convert/model/            the EAGLE-3.1 drafter (+ convert.json)
    OUT/quantize/model/           when --quantize is given (+ quantize.json)
    OUT/validate/report/          report.json, report.md, plots
    OUT/publish/repo/             the Hub repo folder (+ publish.json)

A re-run after a failure or a kill skips the finished stages whose inputs (the target by content) are unchanged
and whose files still have the sha256 recorded when they finished; ``force_stage`` / ``restart`` redo stages.
Every option is checked before the first stage (:func:`check_options`). See docs/reliability.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from .errors import InputError
from .fingerprints import target_fingerprint
from .progress import StageProgress

if TYPE_CHECKING:  # the pipeline (and torch behind it) is imported only once the options are checked
    from .pipeline import PipelineResult, Stage, StageContext, StageResult


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
    validate: bool | None = None  # None: validate when publishing (--publish), else not; False: --no-validate
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
    norm_before_residual: bool | None = None  # --(no-)norm-before-residual (None: the config, else measured)
    vllm_python: str | None = None
    verify: bool = False  # identify the target by the sha256 of its weights, not headers + sizes + mtimes
    force_stage: str | None = None  # re-run this stage and every later one, even when done
    restart: bool = False  # re-run every stage
    extra: dict[str, Any] = field(default_factory=dict)


def _dump(path: Path, obj: Any) -> None:
    data = obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")




def _local(v: str | None) -> Any:
    """A data/prompts spec in the stage hash: a local file or folder by content, anything else by name."""
    if v is not None and Path(v).expanduser().exists():
        return Path(v).expanduser()
    return v


def will_validate(opts: MigrateOptions) -> bool:
    """Whether the validate stage runs: as asked (--validate / --no-validate), else whenever the run publishes, so
    nothing is published that was never measured."""
    return opts.validate if opts.validate is not None else bool(opts.publish)


def engine_note(asked: str, used: str) -> str | None:
    """The line that says the measurement fell back to the reference engine (asked ``auto``, vLLM not importable)."""
    if asked == "auto" and used == "reference":
        return ("measured with the reference engine (pure PyTorch): vLLM is not importable here "
                "(install vllm, or pass --vllm-python PATH / --engine vllm)")
    return None


def validate_message(rep: Any, note: str | None = None) -> str:
    """The validate stage's line: engine, AL ± SE per suite against the source with the paired ratio ± SE and its
    verdict (where the engine counted per request), and the verdict, which says "passed" only when a gate was set."""
    from .validate.report import al_text

    head = f"{rep.engine}{' ' + rep.engine_version if rep.engine_version else ''}" + (" (vLLM not importable)" if note else "")
    als = [f"{s.name} AL {al_text(s.new)}" + (f" (source {al_text(s.baseline)}" + (f"; {s.paired.text()}" if s.paired else "")
                                              + ")" if s.baseline else "")
           for s in rep.suites]
    if rep.failures:
        verdict = "; ".join(rep.failures)
    elif rep.gates:
        verdict = "the gate passed" if len(rep.gates) == 1 else f"all {len(rep.gates)} gates passed"
    else:
        verdict = "no gate set (--min-acceptance-length / --max-regression): measured only"
    return "; ".join([head, verdict, *als])  # the verdict before the numbers: the stage table cuts long lines


def _settle_paths(ctx: StageContext) -> None:
    """A stage writes into a temporary folder (``ctx.out``) that becomes ``ctx.final_dir`` when it returns: the
    JSON / Markdown records it wrote name the temporary folder, so they are rewritten to name the final one (no
    record points at a folder that no longer exists)."""
    olds = {str(ctx.out), str(Path(ctx.out).resolve())}
    new = {str(ctx.out): str(ctx.final_dir), str(Path(ctx.out).resolve()): str(Path(ctx.final_dir).resolve())}
    for f in Path(ctx.out).rglob("*"):
        if f.suffix in (".json", ".md") and f.is_file():
            text = f.read_text(encoding="utf-8")
            got = text
            for old in sorted(olds, key=len, reverse=True):
                got = got.replace(old, new[old])
            if got != text:
                f.write_text(got, encoding="utf-8")


def build_stages(source: Path, target: str, opts: MigrateOptions, progress: StageProgress | None = None) -> list[Stage]:
    """The stage list for one migration (exposed for tests and for the demo).

    Each stage calls its library function with exactly the keyword arguments of its ``args`` dict, and that dict
    (with the target by content and local data files by content) is what the pipeline hashes: an option that
    reaches a stage re-runs it when it changes, and nothing else does. ``progress`` (not hashed) receives convert's
    stage events (statistics, agreement, calibration steps)."""
    from .pipeline import Stage, StageResult

    validate = will_validate(opts)
    source = Path(source)
    tprint = target_fingerprint(target, verify=opts.verify)

    def hashed(args: dict[str, Any]) -> dict[str, Any]:
        h = dict(args)
        h["target"] = {"spec": args.get("target"), "content": tprint} if args.get("target") == target else args.get("target")
        for key in ("data", "prompts_file"):
            if key in h and isinstance(h[key], str):
                h[key] = _local(h[key])
        return h

    inspect_args = {"path": source, "target": target, "aux_ids_convention": opts.aux_ids_convention, "device": opts.device}
    convert_args = {"source": source, "target": target, "data": opts.data, "num_sequences": opts.num_sequences,
                    "output_format": opts.output_format, "device": opts.device, "dtype": opts.dtype,
                    "calibrate": opts.calibrate, "steps": opts.steps, "train": opts.train, "seed": opts.seed,
                    "num_speculative_tokens": opts.k, "max_minutes": opts.max_minutes,
                    "aux_ids_convention": opts.aux_ids_convention}
    if opts.norm_before_residual is not None:  # only when given: the stage hashes of earlier runs stay as they were
        convert_args["norm_before_residual"] = opts.norm_before_residual
    quantize_args = {"scheme": opts.quantize, "target": target, "data": opts.data, "quantize_fc": opts.quantize_fc,
                     "validate": "none"}
    validate_args = {"target": target, "engine": opts.engine, "suites": opts.suites, "prompts_file": opts.prompts_file,
                     "k": opts.k, "baseline": source, "min_acceptance_length": opts.min_acceptance_length,
                     "max_regression_pct": opts.max_regression_pct, "num_prompts": opts.num_prompts,
                     "max_tokens": opts.max_tokens, "seed": opts.seed, "vllm_python": opts.vllm_python,
                     "device": opts.device}
    publish_args = {"repo_id": opts.publish, "private": opts.private, "create_pr": opts.create_pr,
                    "revision": opts.revision, "dry_run": opts.publish_dry_run, "target": target,
                    "num_speculative_tokens": opts.k, "force": not validate, "forced_by": "--no-validate"}

    def inspect_stage(ctx: StageContext) -> StageResult:
        from .inspection import inspect_checkpoint

        rep = inspect_checkpoint(**inspect_args)
        _dump(ctx.out / "inspect.json", rep)
        _settle_paths(ctx)
        errors = [f"{f.code}: {f.message}" for f in rep.findings if f.severity == "error"]
        return StageResult(
            outputs={"format": rep.format, "producer": rep.producer, "errors": len(errors)},
            gate_passed=not errors,
            message="; ".join(errors)[:300] if errors else f"{rep.format} from {rep.producer}",
        )

    def convert_stage(ctx: StageContext) -> StageResult:
        from .convert import convert

        res = convert(out=ctx.out / "model", progress=progress, **convert_args)
        _dump(ctx.out / "convert.json", res)
        _settle_paths(ctx)
        a = res.agreement.step0
        return StageResult(outputs={"model": "convert/model", "step0_agreement": res.agreement.step0,
                                    "calibration": res.calibration.status, "calibration_required": res.calibration_required},
                           message="step-0 agreement " + ("not measured" if a is None else f"{a:.3f}"))

    def model_dir(ctx: StageContext) -> Path:
        q = ctx.path("quantize") / "model"
        return q if opts.quantize and q.exists() else ctx.path("convert") / "model"

    def quantize_stage(ctx: StageContext) -> StageResult:
        from .quantize import quantize

        res = quantize(ctx.path("convert") / "model", ctx.out / "model", **quantize_args)
        _dump(ctx.out / "quantize.json", res)
        _settle_paths(ctx)
        return StageResult(outputs={"model": "quantize/model", "ratio": res.checkpoint_ratio},
                           message=f"{res.scheme}: {res.checkpoint_ratio:.2f}x smaller")

    def validate_stage(ctx: StageContext) -> StageResult:
        from .validate.api import validate

        rep = validate(model_dir(ctx), report_dir=ctx.out / "report", **validate_args)
        _settle_paths(ctx)
        table = {s.name: {"new": s.new.acceptance_length, "baseline": s.baseline.acceptance_length if s.baseline else None}
                 for s in rep.suites}
        note = engine_note(opts.engine, rep.engine)
        if note:
            ctx.log(f"[validate] {note}")
        return StageResult(outputs={"report": "validate/report", "passed": rep.passed, "engine": rep.engine,
                                    "engine_note": note, "gates": len(rep.gates), "acceptance_length": table},
                           gate_passed=rep.passed, message=validate_message(rep, note))

    def publish_stage(ctx: StageContext) -> StageResult:
        from .publish import publish

        report = ctx.path("validate") / "report" if validate else None
        res = publish(model_dir(ctx), report_dir=report, out_dir=ctx.out / "repo", **publish_args)
        _dump(ctx.out / "publish.json", res)
        _settle_paths(ctx)
        return StageResult(outputs={"repo": "publish/repo", "repo_id": res.repo_id, "dry_run": res.dry_run,
                                    "commit_url": res.commit_url, "pr_url": res.pr_url},
                           message=("planned " if res.dry_run else "uploaded ") + f"{len(res.files)} files")

    stages = [
        Stage("inspect", inspect_stage, hashed(inspect_args), "read the checkpoint and check it against the target"),
        Stage("convert", convert_stage, hashed(convert_args), "EAGLE-3.1 structure, norm initialisation, calibration"),
    ]
    if opts.quantize:
        stages.append(Stage("quantize", quantize_stage, hashed(quantize_args), "compressed-tensors quantization"))
    if validate:
        stages.append(Stage("validate", validate_stage, hashed(validate_args), "acceptance length against the source drafter"))
    if opts.publish:
        stages.append(Stage("publish", publish_stage, hashed(publish_args), "model card, speculative configs, upload"))
    return stages




def check_options(source: Path, target: str, out: Path, opts: MigrateOptions) -> None:
    """Every option of every stage, checked before the first stage starts (a typo costs seconds, not a
    conversion): exit 2 with the option's name."""
    from .corpora import SUITE_NAMES
    from .devices import DEVICES, DTYPES, resolve_device
    from .choices import Engine, OutputFormat, SchemeName, TrainMode, values

    def choice(flag: str, value: Any, allowed: list[str] | tuple[str, ...]) -> None:
        if value is not None and value not in allowed:
            raise InputError(f"{flag} {value!r} is not one of {', '.join(allowed)}", f"pass {flag} {allowed[0]} (see --help)")

    if not source.exists():
        raise InputError(f"{source}: no such checkpoint")
    if not isinstance(target, str) or not target.strip():
        raise InputError("--target is empty", "pass the target model: a local folder or a hub id")
    choice("--quantize", opts.quantize, values(SchemeName))
    choice("--engine", opts.engine, values(Engine))
    choice("--output-format", opts.output_format, values(OutputFormat))
    choice("--train", opts.train, values(TrainMode))
    choice("--device", opts.device, DEVICES)
    choice("--dtype", opts.dtype, DTYPES)
    if opts.device == "cuda":
        resolve_device(opts.device)  # --device cuda without CUDA (imports torch: only when asked for)
    if opts.suites is not None:
        if not opts.suites:
            raise InputError("--suite names no suite", f"choose from {', '.join(SUITE_NAMES)}")
        for s in opts.suites:
            choice("--suite", s, SUITE_NAMES)
    if opts.prompts_file is not None and not Path(opts.prompts_file).is_file():
        raise InputError(f"--prompts {opts.prompts_file}: no such file")
    if opts.vllm_python is not None and not Path(opts.vllm_python).is_file():
        raise InputError(f"--vllm-python {opts.vllm_python}: no such file", "pass the path of a Python that has vLLM")
    for flag, v, lo in (("-k", opts.k, 1), ("--num-prompts", opts.num_prompts, 1), ("--max-tokens", opts.max_tokens, 1),
                        ("--steps", opts.steps, 0), ("--num-sequences", opts.num_sequences, 1)):
        if v is not None and v < lo:
            raise InputError(f"{flag} {v} must be at least {lo}")
    if opts.validate is False and (opts.min_acceptance_length is not None or opts.max_regression_pct is not None):
        raise InputError("--min-acceptance-length / --max-regression are gates of the validate stage, and --no-validate skips it",
                         "drop --no-validate, or drop the gate")
    if opts.publish is not None:
        from .publish import REPO_ID

        if not REPO_ID.match(opts.publish):
            raise InputError(f"--publish {opts.publish!r} is not ORG/NAME", "e.g. --publish my-org/llama31-8b-eagle3.1")
        if opts.revision is not None and (not opts.revision.strip() or opts.revision.startswith("refs/pr/")):
            raise InputError(f"--revision {opts.revision!r} is not a branch name", "pass a branch, or --create-pr")
    if not Path(out).exists():
        from .formats.output import check_writable_parent

        check_writable_parent(Path(out))
    _check_room(source, out)


def _check_room(source: Path, out: Path) -> None:
    """The output's file system must hold about twice the source's weights (convert + quantize copies)."""
    import shutil as _shutil

    from .formats.io import WEIGHT_SUFFIXES

    files = [source] if source.is_file() else [p for p in source.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    need = 2 * sum(p.stat().st_size for p in files)
    anc = Path(out).resolve()
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    try:
        usage = _shutil.disk_usage(anc)
    except OSError:
        return
    free = usage.free
    if usage.total and free < need:  # (a pseudo file system reports 0 of 0)
        raise InputError(f"{out}: {free / 1e9:.2f} GB free on that disk, the run needs about {need / 1e9:.2f} GB",
                         "free some space or choose an -o on another disk")


def migrate(source: Path | str, target: str, out: Path | str, opts: MigrateOptions | None = None,
            log: Callable[[str], None] | None = None, progress: StageProgress | None = None) -> PipelineResult:
    """Run every stage into ``out`` (resuming a previous run there); see the module docstring. Every option is
    checked (:func:`check_options`) and the output folder too before the first stage starts."""
    opts = opts or MigrateOptions()
    source = Path(source)
    check_options(source, target, Path(out), opts)
    from .pipeline import Pipeline
    pipe = Pipeline(Path(out), build_stages(source, target, opts, progress), protect=[source, target, opts.data, opts.prompts_file], log=log,
                    progress=progress)
    return pipe.run(force=opts.restart, force_stage=opts.force_stage)
