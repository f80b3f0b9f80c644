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
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, model_validator

# the stages, each called through its module when it runs (so a test that replaces one is obeyed)
from . import convert as _convert
from . import inspection as _inspection
from . import publish as _publish
from . import quantize as _quantize
from .choices import AuxIdsConvention, Device, Dtype, Engine
from .convert.options import ConvertOptions
from .corpora import SUITE_NAMES
from .devices import resolve_device
from .errors import InputError
from .fingerprints import target_fingerprint
from .formats.io import WEIGHT_SUFFIXES
from .formats.output import check_writable_parent
from .options import Options, choice
from .pipeline import Pipeline, PipelineResult, Stage, StageContext, StageResult
from .progress import StageProgress
from .publish.models import REPO_ID
from .publish.options import PublishOptions
from .quant.schemes import get_scheme
from .quantize.options import QuantizeOptions
from .validate import api as _validate
from .validate.options import ValidateOptions
from .validate.report import al_text

# the run-wide options: one value, given to every stage that has the field (under the name on the right)
RUN_WIDE: dict[str, dict[str, str]] = {
    "device": {"convert": "device", "validation": "device"},  # and inspect's
    "dtype": {"convert": "dtype", "validation": "dtype"},
    "seed": {"convert": "seed", "validation": "seed"},
    "num_speculative_tokens": {"convert": "num_speculative_tokens", "validation": "k",
                               "publishing": "num_speculative_tokens", "quantization": "num_speculative_tokens"},
    "data": {"convert": "data", "quantization": "data"},
    "aux_ids_convention": {"convert": "aux_ids_convention"},  # and inspect's
    "engine": {"convert": "engine", "validation": "engine"},  # convert: its calibration's held-out continuations
    "vllm_python": {"convert": "vllm_python", "validation": "vllm_python"},
}


class MigrateOptions(Options):
    """``migrate``'s options: each stage's own options model, composed, and the run-wide options once (each given to
    every stage that takes it: :data:`RUN_WIDE`). ``MigrateOptions.of(steps=5, scheme="fp8-dynamic", repo_id=...)``
    routes each keyword to its field (the CLI builds it so, flag by flag)."""

    ROUTES = {"suites": "validation"}  # quantize's gate has suites too (its jobs); migrate's --suite is validate's

    # run-wide
    device: choice(Device, "--device") = "auto"
    dtype: choice(Dtype, "--dtype") = "auto"
    seed: int = 0
    num_speculative_tokens: int = 3  # -k
    data: Optional[str | Path] = None  # calibration data (convert) and activation ranges (quantize)
    aux_ids_convention: Optional[choice(AuxIdsConvention, "--aux-ids-convention")] = None
    engine: choice(Engine, "--engine") = "auto"  # what serves the target: calibration's held-out set, validate
    vllm_python: Optional[str] = None
    # the stages' own options
    convert: ConvertOptions = Field(default_factory=ConvertOptions)
    quantization: QuantizeOptions = Field(default_factory=QuantizeOptions)  # scheme None: no quantize stage
    validation: ValidateOptions = Field(default_factory=ValidateOptions)
    publishing: PublishOptions = Field(default_factory=PublishOptions)  # repo_id None: nothing is published
    run_validate: Optional[bool] = None  # None: validate when publishing (--publish), else not; False: --no-validate
    # the run itself
    verify: bool = False  # identify the target by the sha256 of its weights, not headers + sizes + mtimes
    force_stage: Optional[str] = None  # re-run this stage and every later one, even when done
    restart: bool = False  # re-run every stage

    @model_validator(mode="after")
    def _run_wide_once(self) -> MigrateOptions:
        """A run-wide option is set on migrate's options, never on one stage's (it would be overruled)."""
        for part, model in (("convert", self.convert), ("quantization", self.quantization),
                            ("validation", self.validation), ("publishing", self.publishing)):
            own = {f for names in RUN_WIDE.values() for p, f in names.items() if p == part}
            if part == "convert":
                own |= {f for f in ("engine", "vllm_python") if f in model.calibration.model_fields_set}
                own &= set(model.model_fields_set) | set(model.calibration.model_fields_set)
            else:
                own &= set(model.model_fields_set)
            if own:
                raise InputError(f"migrate: {', '.join(sorted(own))} set on the {part} options; it is run-wide",
                                 "set it on MigrateOptions itself (one value for every stage)")
        return self


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
    return opts.run_validate if opts.run_validate is not None else bool(opts.publishing.repo_id)


def engine_note(asked: str, used: str) -> str | None:
    """The line that says the measurement fell back to the reference engine (asked ``auto``, vLLM not importable)."""
    if asked == "auto" and used == "reference":
        return ("measured with the reference engine (pure PyTorch): vLLM is not importable here "
                "(install vllm, or pass --vllm-python PATH / --engine vllm)")
    return None


def validate_message(rep: Any, note: str | None = None) -> str:
    """The validate stage's line: engine, AL ± SE per suite against the source with the paired ratio ± SE and its
    verdict (where the engine counted per request), and the verdict, which says "passed" only when a gate was set."""
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


def _also_set(model: Options, args: dict[str, Any], part: str) -> dict[str, Any]:
    """The options of a stage's model set beyond ``args`` (a library caller's), except run-wide ones: they reach the
    stage too. Only set ones: a default adds nothing, so the stage hashes of earlier runs stay as they were."""
    run_wide = {f for names in RUN_WIDE.values() for p, f in names.items() if p == part}
    out = {f: getattr(model, f) for f in sorted(model.model_fields_set)
           if f not in args and f not in run_wide and not isinstance(getattr(model, f), Options)}
    return out


def convert_options(opts: MigrateOptions) -> ConvertOptions:
    """convert's options: the user's own (``opts.convert``, holding only what was given) with the run-wide values laid
    over, handed to convert whole. Never spread into keywords and parsed again: a resolved default (``train`` resolved
    to ``norms`` by ``CalibrationSettings.mode``) would reach convert as if typed and turn its judge-only default into
    a fine-tune of the wrong recipe (issue 48)."""
    wide: dict[str, Any] = {"data": opts.data, "device": opts.device, "dtype": opts.dtype, "seed": opts.seed,
                            "num_speculative_tokens": opts.num_speculative_tokens,
                            "aux_ids_convention": opts.aux_ids_convention}
    if opts.engine != "auto":  # the calibration's held-out continuations (vLLM, or transformers with reference)
        wide["engine"] = opts.engine
    if opts.vllm_python is not None:
        wide["vllm_python"] = opts.vllm_python
    return opts.convert.replace(**wide)


def stage_args(source: Path, target: str, opts: MigrateOptions) -> dict[str, dict[str, Any]]:
    """The keyword arguments each stage's library function is called with (and that the pipeline hashes), from the
    composed options: each stage's own options and the run-wide ones it takes (:data:`RUN_WIDE`). convert takes its
    options model whole (:func:`convert_options`); its hash is that model's dump, less its defaults."""
    q, v, p = opts.quantization, opts.validation, opts.publishing
    validate = {"target": target, "engine": opts.engine, "suites": v.suites,
                "prompts_file": str(v.prompts_file) if v.prompts_file is not None else None,
                "k": opts.num_speculative_tokens, "baseline": source, "min_acceptance_length": v.min_acceptance_length,
                "max_regression_pct": v.max_regression_pct, "num_prompts": v.num_prompts, "max_tokens": v.max_tokens,
                "seed": opts.seed, "vllm_python": opts.vllm_python, "device": opts.device}
    out = {
        "inspect": {"path": source, "target": target, "aux_ids_convention": opts.aux_ids_convention, "device": opts.device},
        "convert": {"source": source, "target": target, "options": convert_options(opts)},
        "quantize": {"scheme": q.scheme, "target": target, "data": opts.data, "quantize_fc": q.quantize_fc,
                     "validate": "none"},
        "validate": validate,
        "publish": {"repo_id": p.repo_id, "private": p.private, "create_pr": p.create_pr, "revision": p.revision,
                    "dry_run": p.dry_run, "target": target, "num_speculative_tokens": opts.num_speculative_tokens,
                    "force": not will_validate(opts), "forced_by": "--no-validate"},
    }
    for name, part, model in (("quantize", "quantization", q), ("validate", "validation", v),
                              ("publish", "publishing", p)):
        out[name].update(_also_set(model, out[name], part))
    return out


def calibration_decision(res: Any) -> dict[str, Any]:
    """What convert's calibration step did, as convert's own report says it (``res``: a ConvertResult): its one-line
    ``decision`` ("judged only (CPU default)") and, where a fine-tune ran, its train mode, data and steps. The migrate
    manifest records them beside convert's ``defaults`` (why)."""
    d = res.calibration.details or {}
    ran = res.calibration.status == "calibrated"
    return {"decision": res.decision, "train": d.get("train") if ran else None, "data": d.get("data") if ran else None,
            "steps_run": d.get("steps_run") if ran else None}


def build_stages(source: Path, target: str, opts: MigrateOptions, progress: StageProgress | None = None) -> list[Stage]:
    """The stage list for one migration (exposed for tests and for the demo).

    Each stage calls its library function with exactly the keyword arguments of its ``args`` dict
    (:func:`stage_args`), and that dict (with the target by content and local data files by content) is what the
    pipeline hashes: an option that reaches a stage re-runs it when it changes, and nothing else does. ``progress``
    (not hashed) receives convert's and validate's stage events (statistics, calibration steps, the held-out
    continuations, the validation suites)."""
    validate = will_validate(opts)
    source = Path(source)
    tprint = target_fingerprint(target, verify=opts.verify)

    def hashed(args: dict[str, Any]) -> dict[str, Any]:
        h = dict(args)
        if isinstance(h.get("options"), Options):  # an options model: its dump less its defaults, data by content
            o = h["options"]
            h["options"] = o.model_dump(mode="json", exclude_defaults=True)
            h["data"] = getattr(o, "data", None)
        h["target"] = {"spec": args.get("target"), "content": tprint} if args.get("target") == target else args.get("target")
        for key in ("data", "prompts_file"):
            if key in h and isinstance(h[key], str):
                h[key] = _local(h[key])
        return h

    args = stage_args(source, target, opts)
    inspect_args, convert_args, quantize_args = args["inspect"], args["convert"], args["quantize"]
    validate_args, publish_args = args["validate"], args["publish"]

    def inspect_stage(ctx: StageContext) -> StageResult:
        rep = _inspection.inspect_checkpoint(**inspect_args)
        _dump(ctx.out / "inspect.json", rep)
        _settle_paths(ctx)
        errors = [f"{f.code}: {f.message}" for f in rep.findings if f.severity == "error"]
        return StageResult(
            outputs={"format": rep.format, "producer": rep.producer, "errors": len(errors)},
            gate_passed=not errors,
            message="; ".join(errors)[:300] if errors else f"{rep.format} from {rep.producer}",
        )

    def convert_stage(ctx: StageContext) -> StageResult:
        res = _convert.convert(convert_args["source"], convert_args["target"], ctx.out / "model",
                               options=convert_args["options"], progress=progress)
        _dump(ctx.out / "convert.json", res)
        _settle_paths(ctx)
        a = res.agreement.step0
        decided = calibration_decision(res)
        return StageResult(outputs={"model": "convert/model", "step0_agreement": res.agreement.step0,
                                    "calibration": res.calibration.status, "calibration_required": res.calibration_required,
                                    "source_kind": res.source_kind.kind if res.source_kind else None,
                                    "defaults": res.defaults, **decided},
                           message="; ".join(["step-0 agreement " + ("not measured" if a is None else f"{a:.3f}"),
                                              decided["decision"]]))

    def model_dir(ctx: StageContext) -> Path:
        q = ctx.path("quantize") / "model"
        return q if opts.quantization.scheme and q.exists() else ctx.path("convert") / "model"

    def quantize_stage(ctx: StageContext) -> StageResult:
        res = _quantize.quantize(ctx.path("convert") / "model", ctx.out / "model", **quantize_args)
        _dump(ctx.out / "quantize.json", res)
        _settle_paths(ctx)
        return StageResult(outputs={"model": "quantize/model", "ratio": res.checkpoint_ratio},
                           message=f"{res.scheme}: {res.checkpoint_ratio:.2f}x smaller")

    def validate_stage(ctx: StageContext) -> StageResult:
        rep = _validate.validate(model_dir(ctx), report_dir=ctx.out / "report", progress=progress, **validate_args)
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
        report = ctx.path("validate") / "report" if validate else None
        res = _publish.publish(model_dir(ctx), report_dir=report, out_dir=ctx.out / "repo", **publish_args)
        _dump(ctx.out / "publish.json", res)
        _settle_paths(ctx)
        return StageResult(outputs={"repo": "publish/repo", "repo_id": res.repo_id, "dry_run": res.dry_run,
                                    "commit_url": res.commit_url, "pr_url": res.pr_url},
                           message=("planned " if res.dry_run else "uploaded ") + f"{len(res.files)} files")

    stages = [
        Stage("inspect", inspect_stage, hashed(inspect_args), "read the checkpoint and check it against the target"),
        Stage("convert", convert_stage, hashed(convert_args), "EAGLE-3.1 structure, norm initialisation, calibration"),
    ]
    if opts.quantization.scheme:
        stages.append(Stage("quantize", quantize_stage, hashed(quantize_args), "compressed-tensors quantization"))
    if validate:
        stages.append(Stage("validate", validate_stage, hashed(validate_args), "acceptance length against the source drafter"))
    if opts.publishing.repo_id:
        stages.append(Stage("publish", publish_stage, hashed(publish_args), "model card, speculative configs, upload"))
    return stages




def check_options(source: Path, target: str, out: Path, opts: MigrateOptions) -> None:
    """Every option of every stage, checked before the first stage starts (a typo costs seconds, not a
    conversion): exit 2 with the option's name. The closed choices (--train, --output-format, --engine, --device,
    --dtype, --aux-ids-convention) are checked where they are declared, when the options are built."""
    v, p = opts.validation, opts.publishing
    if not source.exists():
        raise InputError(f"{source}: no such checkpoint")
    if not isinstance(target, str) or not target.strip():
        raise InputError("--target is empty", "pass the target model: a local folder or a hub id")
    if opts.quantization.scheme is not None:
        get_scheme(opts.quantization.scheme)  # an unknown --quantize is refused here, with the schemes listed
    if opts.device == "cuda":
        resolve_device(opts.device)  # --device cuda without CUDA
    if v.suites is not None:
        if not v.suites:
            raise InputError("--suite names no suite", f"choose from {', '.join(SUITE_NAMES)}")
        for s in v.suites:
            if s not in SUITE_NAMES:
                raise InputError(f"--suite {s!r} is not one of {', '.join(SUITE_NAMES)}",
                                 f"pass --suite {SUITE_NAMES[0]} (see --help)")
    if v.prompts_file is not None and not Path(v.prompts_file).is_file():
        raise InputError(f"--prompts {v.prompts_file}: no such file")
    if opts.vllm_python is not None and not Path(opts.vllm_python).is_file():
        raise InputError(f"--vllm-python {opts.vllm_python}: no such file", "pass the path of a Python that has vLLM")
    for flag, val, lo in (("-k", opts.num_speculative_tokens, 1), ("--num-prompts", v.num_prompts, 1),
                          ("--max-tokens", v.max_tokens, 1), ("--steps", opts.convert.calibration.steps, 0),
                          ("--num-sequences", opts.convert.num_sequences, 1)):
        if val is not None and val < lo:
            raise InputError(f"{flag} {val} must be at least {lo}")
    if opts.run_validate is False and (v.min_acceptance_length is not None or v.max_regression_pct is not None):
        raise InputError("--min-acceptance-length / --max-regression are gates of the validate stage, and --no-validate skips it",
                         "drop --no-validate, or drop the gate")
    if p.repo_id is not None:
        if not REPO_ID.match(p.repo_id):
            raise InputError(f"--publish {p.repo_id!r} is not ORG/NAME", "e.g. --publish my-org/llama31-8b-eagle3.1")
        if p.revision is not None and (not p.revision.strip() or p.revision.startswith("refs/pr/")):
            raise InputError(f"--revision {p.revision!r} is not a branch name", "pass a branch, or --create-pr")
    if not Path(out).exists():
        check_writable_parent(Path(out))
    _check_room(source, out)


def _check_room(source: Path, out: Path) -> None:
    """The output's file system must hold about twice the source's weights (convert + quantize copies)."""
    import shutil as _shutil

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
    pipe = Pipeline(Path(out), build_stages(source, target, opts, progress),
                    protect=[source, target, opts.data, opts.validation.prompts_file], log=log, progress=progress)
    return pipe.run(force=opts.restart, force_stage=opts.force_stage)
