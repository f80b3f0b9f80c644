from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..choices import Engine
from ..errors import CheckFailed
from . import app
from .options import CheckpointArg, JsonOpt, RequiredTargetOpt, SeedOpt
from .render import log, print_json, stdout


def render(r) -> None:
    from rich.table import Table

    has_base = any(s.baseline for s in r.suites)
    has_speed = any(s.speedup is not None for s in r.suites)
    stdout.print(f"[bold]{r.checkpoint}[/] on {r.target} ({r.engine} {r.engine_version or ''}, k={r.settings['num_speculative_tokens']}, "
                 f"T={r.settings['temperature']})", highlight=False)
    t = Table(show_header=True, header_style="bold")
    cols = ["suite", "n", "AL"] + (["base AL", "Δ%"] if has_base else []) + \
           ["acc.", "per pos."] + (["speedup"] if has_speed else []) + ["gate"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("suite", "per pos.", "gate") else "right",
                     no_wrap=c in ("per pos.", "AL", "base AL", "Δ%"))
    for s in r.suites:
        row = [s.name, str(s.prompt_set["size"]), f"{s.new.acceptance_length:.3f}"]
        if has_base:
            row += [f"{s.baseline.acceptance_length:.3f}" if s.baseline else "–",
                    f"{-s.regression_pct:+.1f}" if s.regression_pct is not None else "–"]
        row += [f"{s.new.draft_acceptance_rate:.2f}", " ".join(f"{x:.2f}" for x in s.new.per_position_rate)]
        if has_speed:
            row += [f"{s.speedup:.2f}x" if s.speedup is not None else "–"]
        row += ["[green]pass[/]" if s.passed else "[red]FAIL[/] " + "; ".join(s.failures)]
        t.add_row(*row)
    stdout.print(t)
    for s in r.suites:
        if s.groups:
            parts = [f"{g.name} {g.new.acceptance_length:.2f}" + (f"/{g.baseline.acceptance_length:.2f}" if g.baseline else "")
                     for g in s.groups]
            stdout.print(f"  {s.name}: " + ", ".join(parts), highlight=False)
    d = r.diagnostics
    if d is not None and d.error:
        stdout.print(f"drift diagnostics not measured: {d.error}", highlight=False)
    elif d is not None and d.new:
        stdout.print("drift (step: fed RMS / sink mass / draft mass, new" + (" vs baseline" if d.baseline else "") + "):")
        for suite, dn in d.new.items():
            db = d.baseline.get(suite)
            cells = []
            for j, st in enumerate(dn.steps):
                c = f"{j}: {st.fed_rms:.2g}/{st.sink_mass:.2f}/{st.draft_mass:.2f}"
                if db:
                    b = db.steps[j]
                    c += f" vs {b.fed_rms:.2g}/{b.sink_mass:.2f}/{b.draft_mass:.2f}"
                cells.append(c)
            stdout.print(f"  {suite}: " + "  ".join(cells), highlight=False)
    if r.report_dir:
        stdout.print(f"report: {r.report_dir}/report.md ({', '.join(r.files)})", highlight=False)
    stdout.print("[green]PASSED[/]" if r.passed else "[red]FAILED[/]: " + "; ".join(r.failures))


@app.command()
def validate(
    checkpoint: CheckpointArg,
    target: RequiredTargetOpt,
    engine: Annotated[Engine, typer.Option("--engine", help="vllm (real vLLM in a subprocess), reference (pure PyTorch), "
                                                 "auto: vllm when importable.")] = "auto",
    suite: Annotated[Optional[str], typer.Option("--suite", help="Comma-separated: chat, code, long, template-shift "
                                                 "(default: all four; only --prompts when that is given).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Your own prompts: JSONL ({prompt} | {messages} | "
                                                    "{conversations} | {token_ids}) or a ShareGPT JSON file.")] = None,
    k: Annotated[int, typer.Option("--num-speculative-tokens", "-k", min=1, max=16, help="Draft tokens per step (k).")] = 3,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="Another drafter to compare with (e.g. the EAGLE-3 source).")] = None,
    min_acceptance_length: Annotated[Optional[float], typer.Option("--min-acceptance-length", min=1.0,
                                                                   help="Gate: every suite's AL must reach X (else exit 1).")] = None,
    max_regression: Annotated[Optional[float], typer.Option("--max-regression", help="Gate: no suite may lose more than PCT "
                                                            "percent AL against --baseline (else exit 1).")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write report.json, report.md and PNG plots here.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", min=1, help="Prompts per suite (long: per length "
                                                       "bucket; template-shift: requests per variant).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, help="Output tokens per prompt.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (float32 on CPU, the model's own on GPU), float32, bfloat16, float16.")] = "auto",
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=16, help="Context limit (default: the target's, "
                                                         "at most 8192 on CPU).")] = None,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="vLLM tensor parallelism.")] = 1,
    vllm_python: Annotated[Optional[str], typer.Option("--vllm-python", help="Python interpreter that has vLLM "
                                                       "(default: $EAGLE_MIGRATE_VLLM_PYTHON or this one).")] = None,
    speedup: Annotated[bool, typer.Option("--speedup", help="Also run the target without speculation and report the "
                                          "output-throughput ratio.")] = False,
    diagnostics: Annotated[bool, typer.Option("--diagnostics/--no-diagnostics", help="Drift diagnostics (hidden-state RMS, "
                                              "sink and draft attention mass per step; loads the target in transformers).")] = True,
    attention_backend: Annotated[Optional[str], typer.Option("--attention-backend", help="vLLM attention backend for "
                                                             "MLA models, e.g. CPU_MLA or AMX_MLA (default: chosen "
                                                             "for this host; see docs/validate.md).")] = None,
    seed: SeedOpt = 0,
    json: JsonOpt = False,
) -> None:
    """Acceptance length per suite in real vLLM (or the reference engine), new vs baseline, with CI gates.

    Example: eagle-migrate validate ./eagle31 --target ./target --baseline ./eagle3 --suite chat,long
    --max-regression 2 --report ./report
    """
    from ..validate.api import validate as run

    say = lambda m: log(f"[dim]{m}[/]")  # noqa: E731  (log lines go to stderr, with --json too: a CI log is never silent)
    names = [x.strip() for x in suite.split(",") if x.strip()] if suite else None
    r = run(
        checkpoint, target, engine=engine, suites=names, prompts_file=prompts, k=k, baseline=baseline,
        min_acceptance_length=min_acceptance_length, max_regression_pct=max_regression, report_dir=report,
        num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature, seed=seed, dtype=dtype,
        max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size, vllm_python=vllm_python,
        speedup=speedup, diagnostics=diagnostics, log=say, attention_backend=attention_backend,
    )
    if json:
        print_json(r)
    else:
        render(r)
    if not r.passed:
        raise CheckFailed("; ".join(r.failures))
