from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..choices import OutputFormat
from . import app
from .options import (
    AuxIdsConventionOpt,
    NbrOpt,
    CheckpointArg,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    MaxMinutesOpt,
    NumSpecTokensOpt,
    OutputOpt,
    RequiredTargetOpt,
    SeedOpt,
    TrainOpt,
)
from .render import StageBar, log_plain, print_json, stdout


def render_pipeline(res, title: str = "migrate") -> None:
    from rich.markup import escape
    from rich.table import Table

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


@app.command(short_help="Every stage, inspect to publish, in one resumable run.")
def migrate(
    ckpt: CheckpointArg,
    target: RequiredTargetOpt,
    output: OutputOpt,
    data: Annotated[Optional[str], typer.Option("--data", help="Calibration data (see `convert --help`).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=0, help="Calibration steps.")] = None,
    max_minutes: MaxMinutesOpt = None,
    calibrate: Annotated[Optional[bool], typer.Option("--calibrate/--no-calibrate", help="Run the calibration fine-tune.")] = None,
    train: TrainOpt = "norms",
    output_format: Annotated[OutputFormat, typer.Option("--output-format", help="vllm or speculators layout.")] = "vllm",
    quantize: Annotated[Optional[str], typer.Option("--quantize", help="fp8-dynamic | fp8 | nvfp4a16 | nvfp4 (off by default).")] = None,
    quantize_fc: Annotated[bool, typer.Option("--quantize-fc", help="Quantize fc too.")] = False,
    validate: Annotated[Optional[bool], typer.Option("--validate/--no-validate", help="Measure acceptance length against the source drafter (default: on with --publish; --no-validate skips it and the card says so).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto | vllm | reference.")] = "auto",
    suite: Annotated[Optional[str], typer.Option("--suite", help="Comma-separated suites (chat,code,long,template-shift).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Your own prompts file for validation.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", min=1, help="Prompts per suite.")] = None,
    min_acceptance_length: Annotated[Optional[float], typer.Option("--min-acceptance-length", help="Gate: exit 1 below this AL.")] = None,
    max_regression: Annotated[Optional[float], typer.Option("--max-regression", help="Gate: exit 1 when AL drops more than PCT % vs the source.")] = None,
    publish: Annotated[Optional[str], typer.Option("--publish", help="Hub repo id ORG/NAME to publish to.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Publish: build the repo folder, no network.")] = False,
    private: Annotated[bool, typer.Option("--private", help="Publish: create a private repo.")] = False,
    create_pr: Annotated[bool, typer.Option("--create-pr", help="Publish: open a pull request instead of pushing.")] = False,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Publish: target branch.")] = None,
    k: NumSpecTokensOpt = 3,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    seed: SeedOpt = 0,
    aux_ids_convention: AuxIdsConventionOpt = None,
    norm_before_residual: NbrOpt = None,
    vllm_python: Annotated[Optional[str], typer.Option("--vllm-python", help="Python that has vLLM (default: this one).")] = None,
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
    from ..migrate import MigrateOptions
    from ..migrate import migrate as run_migrate

    opts = MigrateOptions(
        data=data, steps=steps, max_minutes=max_minutes, calibrate=calibrate, train=train, output_format=output_format, quantize=quantize,
        quantize_fc=quantize_fc, validate=validate, engine=engine,
        suites=[s.strip() for s in suite.split(",") if s.strip()] if suite else None,
        prompts_file=str(prompts) if prompts else None, num_prompts=num_prompts, k=k,
        min_acceptance_length=min_acceptance_length, max_regression_pct=max_regression, publish=publish,
        publish_dry_run=dry_run, private=private, create_pr=create_pr, revision=revision, device=device,
        dtype=dtype, seed=seed, vllm_python=vllm_python, force_stage=force_stage, restart=restart, verify=verify,
        aux_ids_convention=aux_ids_convention, norm_before_residual=norm_before_residual,
    )
    with StageBar("migrate", json) as prog:
        res = run_migrate(ckpt, target, output, opts, log=None if json else log_plain, progress=prog)
    if json:
        print_json(res)
    elif not res.interrupted:  # interrupted: main() prints the one line with the resume command
        render_pipeline(res)
    if res.exit_code:
        raise typer.Exit(res.exit_code)
