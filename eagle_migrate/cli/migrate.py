from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .options import (
    COMMANDS,
    AuxIdsConventionOpt,
    CalibrateOpt,
    CheckpointArg,
    CommandOptions,
    CreatePrOpt,
    DataOpt,
    DeviceOpt,
    DtypeOpt,
    EngineOpt,
    FormatOpt,
    JsonOpt,
    MaxMinutesOpt,
    MaxRegressionOpt,
    MinAcceptanceLengthOpt,
    NbrOpt,
    NumPromptsOpt,
    NumSpecTokensOpt,
    OutputOpt,
    PrivateOpt,
    PromptsOpt,
    QuantizeFcOpt,
    RequiredTargetOpt,
    RevisionOpt,
    SeedOpt,
    StepsOpt,
    SuiteOpt,
    TrainedForOpt,
    TrainOpt,
    VllmPythonOpt,
    options_of,
)
from .render import StageBar, log_plain, print_json, stdout


def render_pipeline(res, title: str = "migrate") -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    t = Table(title=f"{title}: {res.out_dir}")
    for c in ("stage", "status", "action", "seconds", "message"):
        t.add_column(c)
    for s in res.stages:
        text = s.message or ""
        if s.status == "failed" and s.error:  # the failed row carries its error line
            text = f"error: {s.error}"
        t.add_row(s.name, s.status, s.action, "" if s.seconds is None else f"{s.seconds:.1f}", escape(text[:200]))
    stdout.print(t)
    verdict = "[green]ok[/]" if res.ok else f"[red]failed[/] at {res.failed_stage} (exit {res.exit_code})"
    stdout.print(f"{verdict}; manifest: {escape(res.manifest)}")
    if res.hint:
        stdout.print(f"[dim]hint:[/] {escape(res.hint)}")


def options_model():
    """The command's options model (MigrateOptions), imported when the command runs."""
    from ..migrate import MigrateOptions  # lazy: every stage's options model stays out of --help

    return MigrateOptions


COMMANDS["migrate"] = CommandOptions(options_model, inputs=("source", "target", "out"))


def migrate(
    source: CheckpointArg,
    target: RequiredTargetOpt,
    out: OutputOpt,
    data: DataOpt = None,
    steps: StepsOpt = None,
    max_minutes: MaxMinutesOpt = None,
    calibrate: CalibrateOpt = None,
    train: TrainOpt = None,
    output_format: FormatOpt = "vllm",
    scheme: Annotated[Optional[str], typer.Option("--quantize", help="fp8-dynamic | fp8 | nvfp4a16 | nvfp4 (off by default).")] = None,
    quantize_fc: QuantizeFcOpt = False,
    run_validate: Annotated[Optional[bool], typer.Option("--validate/--no-validate", help="Measure acceptance length against the source drafter (default: on with --publish; --no-validate skips it and the card says so).")] = None,
    engine: EngineOpt = "auto",
    suites: SuiteOpt = None,
    prompts_file: PromptsOpt = None,
    num_prompts: NumPromptsOpt = None,
    min_acceptance_length: MinAcceptanceLengthOpt = None,
    max_regression_pct: MaxRegressionOpt = None,
    repo_id: Annotated[Optional[str], typer.Option("--publish", help="Hub repo id ORG/NAME to publish to.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Publish: build the repo folder, no network.")] = False,
    private: PrivateOpt = False,
    create_pr: CreatePrOpt = False,
    revision: RevisionOpt = None,
    num_speculative_tokens: NumSpecTokensOpt = 3,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    seed: SeedOpt = 0,
    aux_ids_convention: AuxIdsConventionOpt = None,
    norm_before_residual: NbrOpt = None,
    trained_for: TrainedForOpt = None,
    vllm_python: VllmPythonOpt = None,
    force_stage: Annotated[Optional[str], typer.Option("--force-stage", help="Re-run this stage (inspect, convert, quantize, validate, publish) and every later one, even when finished.")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Re-run every stage (the folder's manifest is kept).")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Identify the target by the sha256 of its weight files (default: safetensors headers, sizes and mtimes).")] = False,
    json: JsonOpt = False,
) -> None:
    """Run inspect -> convert (+ calibration) -> quantize -> validate -> publish into OUT, resumably.

    OUT holds one manifest (migrate-manifest.json) and one folder per stage; re-running the same command after a
    failure or a kill skips the finished stages whose inputs are unchanged and whose files still have the sha256
    recorded when they finished (a damaged or edited stage output runs again); --force-stage STAGE or --restart
    redo finished stages. Exit codes: 0 ok, 1 a gate failed (inspect error finding,
    validation threshold), 2 bad input, 128+N interrupted by signal N.

    With --publish the validate stage runs by default (vLLM when importable, else the reference engine, and the
    stage says which): nothing is published unmeasured unless --no-validate is passed, which the card states.

    Example: eagle-migrate migrate ./eagle3-ckpt --target meta-llama/Llama-3.1-8B-Instruct -o ./out
    --quantize fp8-dynamic --publish my-org/llama31-8b-eagle3.1
    """
    opts = options_of("migrate", locals())
    from ..migrate import migrate as run_migrate  # lazy: every stage's options (pydantic, formats) stay out of --help

    with StageBar("migrate", json) as prog:
        res = run_migrate(source, target, out, opts, log=None if json else log_plain, progress=prog)
    if json:
        print_json(res)
    elif not res.interrupted:  # interrupted: main() prints the one line with the resume command
        render_pipeline(res)
    if res.exit_code:
        raise typer.Exit(res.exit_code)
