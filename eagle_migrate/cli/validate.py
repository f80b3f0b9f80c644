from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional, Tuple

import typer
from rich.console import Console

from ..errors import CheckFailed, ServerError
from .options import (
    COMMANDS,
    CommandOptions,
    EngineOpt,
    JsonOpt,
    MaxRegressionOpt,
    MinAcceptanceLengthOpt,
    NumPromptsOpt,
    OptionalCheckpointArg,
    PromptsOpt,
    SeedOpt,
    SuiteOpt,
    TargetOpt,
    VllmPythonOpt,
    options_of,
)
from .render import log, print_json, stdout


def render(r) -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    # lazy: torch (validate.report imports it)
    from ..validate.report import al_text, comparison_line, fmt_value, overall_line, verdict_line

    has_base = any(s.baseline for s in r.suites)
    has_speed = any(s.speedup is not None for s in r.suites)
    stdout.print(f"[bold]{r.checkpoint or 'the served drafter'}[/] on {r.target} ({r.engine} {r.engine_version or ''}, k={r.settings['num_speculative_tokens']}, "
                 f"T={r.settings['temperature']})", highlight=False)
    t = Table(show_header=True, header_style="bold")
    cols = ["suite", "n", "AL"] + (["base AL", "Δ%"] if has_base else []) + \
           ["acc.", "per pos."] + (["speedup"] if has_speed else []) + ["gate"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("suite", "per pos.", "gate") else "right",
                     no_wrap=c in ("per pos.", "AL", "base AL", "Δ%"))
    for s in r.suites:
        row = [s.name, str(s.prompt_set["size"]), al_text(s.new)]
        if has_base:
            row += [al_text(s.baseline),
                    fmt_value(-s.regression_pct, 1, sign=True) if s.regression_pct is not None else "–"]
        row += [f"{s.new.draft_acceptance_rate:.2f}", " ".join(f"{x:.2f}" for x in s.new.per_position_rate)]
        if has_speed:
            row += [f"{s.speedup:.2f}x" if s.speedup is not None else "–"]
        row += [("[green]pass[/]" if r.gates else "–") if s.passed else "[red]FAIL[/]"]
        t.add_row(*row)
    # AL ± SE of both drafters: not squeezed into rich's 80 columns in a log or pipe (a terminal keeps its width)
    (stdout if stdout.is_terminal else Console(width=max(stdout.width, 120), soft_wrap=True)).print(t)
    for s in r.suites:  # the failures under the table, in full
        if s.failures:
            stdout.print(f"  [red]FAIL[/] {s.name}: " + "; ".join(s.failures), highlight=False)
    if has_base:  # each suite's comparison in words: AL ± SE of both, the paired ratio ± SE and its verdict
        for s in r.suites:
            stdout.print(f"  {s.name}: {comparison_line(s.new, s.baseline, s.paired)}", highlight=False)
    if overall_line(r) and (has_base or len(r.suites) > 1):
        stdout.print(f"  overall: {overall_line(r)}", highlight=False)
    for s in r.suites:
        if s.groups:
            parts = [f"{g.name} {g.new.acceptance_length:.2f}" + (f"/{g.baseline.acceptance_length:.2f}" if g.baseline else "")
                     for g in s.groups]
            stdout.print(f"  {s.name}: " + ", ".join(parts), highlight=False)
    if r.server is not None:
        sc = r.server.speculative_config
        stdout.print(f"server {r.server.url}: vLLM {r.server.vllm_version or '?'}, model {r.server.model}, "
                     + ", ".join(f"{k_}={v} ({r.server.sources.get(k_, '?')})" for k_, v in sc.items()), highlight=False)
    if r.serving_speed is not None:
        ts = Table(show_header=True, header_style="bold",
                   title="per-user output tokens/s (median of runs), speculative vs baseline server; "
                         "speed-up = median of the per-round ratios")
        for c in ("C", "spec tok/s", "base tok/s", "speed-up (min-max)", "TTFT p50 ms", "ITL p50 ms", "TPOT p50 ms"):
            ts.add_column(c, justify="right")
        import statistics as st_

        for lv in r.serving_speed.levels:
            med = lambda runs, f: st_.median([f(x) for x in runs])  # noqa: E731
            ts.add_row(str(lv.concurrency), f"{med(lv.speculative, lambda x: x.per_user_tokens_per_second):.1f}",
                       f"{med(lv.baseline, lambda x: x.per_user_tokens_per_second):.1f}",
                       f"{lv.speedup:.2f}x ({lv.speedup_min:.2f}-{lv.speedup_max:.2f})",
                       f"{med(lv.speculative, lambda x: x.ttft_ms.p50):.1f} / {med(lv.baseline, lambda x: x.ttft_ms.p50):.1f}",
                       f"{med(lv.speculative, lambda x: x.itl_ms.p50):.1f} / {med(lv.baseline, lambda x: x.itl_ms.p50):.1f}",
                       f"{med(lv.speculative, lambda x: x.tpot_ms.p50):.1f} / {med(lv.baseline, lambda x: x.tpot_ms.p50):.1f}")
        stdout.print(ts)
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
    line = verdict_line(r)
    stdout.print(f"[green]{line}[/]" if r.passed and r.gates else line if r.passed else f"[red]{line}[/]", highlight=False)


def _triage(opts, say, json: bool) -> None:
    """validate --triage: replay, render (a table of the groups, the worst requests), exit 1 on a failed gate and
    the replay's error (a server that dropped) after the report."""
    from ..validate.server_replay import triage_server  # lazy: httpx (the validate package stays out of --help)

    r = triage_server(opts, log=say)
    print_json(r) if json else render_triage(r)
    if r.error is not None:
        raise ServerError(r.error, r.error_hint)
    if not r.passed:
        raise CheckFailed("; ".join(r.failures))


def render_triage(r) -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    p = r.pooled
    al = f"{p.acceptance_length:.3f}" + (f" ± {p.se:.3f}" if p.se is not None else "") if p.acceptance_length else "–"
    stdout.print(f"[bold]triage[/] of {r.prompts_file} on {r.server.url} (vLLM {r.server.vllm_version or '?'}, "
                 f"k={r.k}): {len(r.requests)}/{r.records} requests, per-request counters from {r.per_request}; "
                 f"pooled AL {al}", highlight=False)
    t = Table(show_header=True, header_style="bold")
    for c in ("feature", "group", "n", "AL ± SE", "rest AL", "z", ""):
        t.add_column(c, justify="right" if c in ("n", "AL ± SE", "rest AL", "z") else "left")
    for g in r.groups:
        t.add_row(g.feature, g.name, str(g.requests),
                  f"{g.acceptance_length:.3f}" + (f" ± {g.se:.3f}" if g.se is not None else ""),
                  "–" if g.rest_acceptance_length is None else f"{g.rest_acceptance_length:.3f}",
                  "–" if g.z is None else f"{g.z:+.1f}", "[red]below[/]" if g.named else
                  f"below, explained by {g.explained_by}" if g.below else "")
    stdout.print(t)
    for line in r.below:
        stdout.print(f"  [red]below the pool:[/] {line}", highlight=False)
    if not r.below and r.groups:
        stdout.print("  no group below the pool beyond noise", highlight=False)
    worst = sorted((q for q in r.requests if q.acceptance_length is not None), key=lambda q: q.acceptance_length)[:5]
    for q in worst:
        stdout.print(f"  line {q.line}: AL {q.acceptance_length:.2f} ({q.prompt_tokens} prompt tokens, {q.kind}, "
                     f"{q.template}) histogram {q.histogram}", highlight=False)
    if r.min_acceptance_length is not None:
        stdout.print(f"  {r.below_floor} requests under --min-acceptance-length {r.min_acceptance_length:g}",
                     highlight=False)
    if r.worst is not None:
        stdout.print(f"worst: {r.worst.records} prompts in {r.worst.file}, {r.worst.heldout_records} held out in "
                     f"{r.worst.heldout_file}", highlight=False)
    if r.comparison is not None:
        render_comparison(r.comparison)


def render_comparison(c) -> None:
    """--compare: the old report's groups before and after on the paired requests, the pooled ratio, what was left out."""
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    def left(n: int, lines: list[int]) -> str:
        more = ", ..." if n > len(lines) else ""
        return f"{n}" + (f" (line{'s' if n > 1 else ''} {', '.join(map(str, lines))}{more})" if n else "")

    stdout.print(f"[bold]before / after[/]: {c.before_file} ({c.before_server or '?'}) against this run: "
                 f"{c.paired} requests paired by {c.keyed_by}; left out: {left(c.only_before, c.only_before_lines)} "
                 f"only before, {left(c.only_after, c.only_after_lines)} only after", highlight=False)

    def al(x, se) -> str:
        return "–" if x is None else f"{x:.3f}" + ("" if se is None else f" ± {se:.3f}")

    t = Table(show_header=True, header_style="bold")
    for col in ("feature", "group", "n", "AL before", "AL after", "after/before ± SE", "verdict"):
        num = col in ("n", "AL before", "AL after", "after/before ± SE")
        t.add_column(col, justify="right" if num else "left", no_wrap=num or col == "verdict")
    colour = {"improved": "green", "worse": "red"}
    for g in [*c.groups, c.pooled]:
        p = g.paired
        ratio = "–" if p.ratio is None else f"{p.ratio:.3f}" + ("" if p.se is None else f" ± {p.se:.3f}")
        v = p.verdict or (p.note or "–")
        t.add_row(g.feature, g.name + (" (was below)" if g.below_before else ""), str(g.requests),
                  al(g.al_before, g.se_before), al(g.al_after, g.se_after), ratio,
                  f"[{colour[v]}]{v}[/]" if v in colour else v)
    # the numbers unwrapped in a log or pipe, as render() does (a terminal keeps its width)
    (stdout if stdout.is_terminal else Console(width=max(stdout.width, 120), soft_wrap=True)).print(t)
    for line in c.improved:
        stdout.print(f"  [green]improved:[/] {line}", highlight=False)
    for line in c.worse:
        stdout.print(f"  [red]worse:[/] {line}", highlight=False)
    stdout.print(f"  pooled: {c.pooled.text}", highlight=False)


def options_model():
    """The command's options model (ValidateOptions), imported when the command runs."""
    from ..engines.options import ValidateOptions  # lazy: the engines package stays out of --help

    return ValidateOptions


COMMANDS["validate"] = CommandOptions(options_model, inputs=("checkpoint", "target"))


def validate(
    checkpoint: OptionalCheckpointArg = None,
    target: TargetOpt = None,
    engine: EngineOpt = "auto",
    suites: SuiteOpt = None,
    prompts_file: PromptsOpt = None,
    k: Annotated[Optional[int], typer.Option("--num-speculative-tokens", "-k", min=1, max=16, help="Draft tokens per "
                                             "step (k; default 3; with --server the server's).")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="Another drafter to compare with (e.g. the EAGLE-3 source).")] = None,
    min_acceptance_length: MinAcceptanceLengthOpt = None,
    max_regression_pct: MaxRegressionOpt = None,
    report_dir: Annotated[Optional[Path], typer.Option("--report", help="Write report.json, report.md and PNG plots here.")] = None,
    num_prompts: NumPromptsOpt = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, help="Output tokens per prompt.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (float32 on CPU, the model's own on GPU), float32, bfloat16, float16.")] = "auto",
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=16, help="Context limit (default: the target's, "
                                                         "at most 8192 on CPU).")] = None,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="vLLM tensor parallelism.")] = 1,
    vllm_python: VllmPythonOpt = None,
    speedup: Annotated[bool, typer.Option("--speedup", help="Also run the target without speculation and report the "
                                          "output-throughput ratio.")] = False,
    diagnostics: Annotated[bool, typer.Option("--diagnostics/--no-diagnostics", help="Drift diagnostics (hidden-state RMS, "
                                              "sink and draft attention mass per step; loads the target in transformers).")] = True,
    attention_backend: Annotated[Optional[str], typer.Option("--attention-backend", help="vLLM attention backend for "
                                                             "MLA models, e.g. CPU_MLA or AMX_MLA (default: chosen "
                                                             "for this host; see docs/validate.md).")] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="Measure a running OpenAI-compatible vLLM server "
                                                  "instead (its API URL, e.g. http://HOST:8000/v1), from /metrics; CKPT "
                                                  "and --target optional (it tokenises, /v1/models names the model).",
                                                  rich_help_panel="Live server")] = None,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="Name of the environment variable that "
                                                       "holds the server's API key (never printed or stored).",
                                                       rich_help_panel="Live server")] = None,
    baseline_server: Annotated[Optional[str], typer.Option("--baseline-server", help="The same target served without "
                                                           "speculation: per-user output tokens/s, TTFT and ITL at each "
                                                           "--concurrency, both servers in alternation.",
                                                           rich_help_panel="Live server")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="Concurrent users for --baseline-server, "
                                             "comma-separated; --triage replays at the largest.",
                                             rich_help_panel="Live server")] = "1,4,16",
    block_size: Annotated[int, typer.Option("--block-size", min=1, help="Requests per block: the counters are read "
                                            "around each block (the standard error is across blocks).",
                                            rich_help_panel="Live server")] = 4,
    triage: Annotated[bool, typer.Option("--triage", help="Which requests lose acceptance: replay --prompts on "
                                         "--server at --concurrency (its largest value), the AL of each request, "
                                         "grouped by prompt length, chat template, system prompt, kind and tenant "
                                         "against the pool (docs/triage.md).", rich_help_panel="Live server")] = False,
    worst: Annotated[Optional[Tuple[int, Path]], typer.Option("--worst", metavar="N FILE", help="With the triage: "
                                                              "write the N lowest-AL requests and the requests of "
                                                              "groups below the pool to FILE (JSONL that convert "
                                                              "--data reads), a held-out part to FILE.heldout.jsonl.",
                                                              rich_help_panel="Live server", show_default=False)] = None,
    compare: Annotated[Optional[Path], typer.Option("--compare", metavar="OLD/triage.json", help="With the triage: "
                                                    "the groups of that earlier triage (--report DIR wrote it) before "
                                                    "and after, on the requests of both runs (same line, same "
                                                    "prompt): AL before, after, the paired ratio ± SE and its "
                                                    "verdict per group, and pooled.", rich_help_panel="Live server",
                                                    show_default=False)] = None,
    seed: SeedOpt = 0,
    json: JsonOpt = False,
) -> None:
    """Acceptance length per suite in real vLLM (or the reference engine), new vs baseline, with CI gates.

    Example: eagle-migrate validate ./eagle31 --target ./target --baseline ./eagle3 --suite chat,long
    --max-regression 2 --report ./report

    Live server: eagle-migrate validate ./eagle31 --target ./target --server http://HOST:8000/v1
    --baseline-server http://HOST:8001/v1 --api-key-env VLLM_API_KEY --report ./report
    """
    opts = options_of("validate", locals())
    say = lambda m: log(f"[dim]{m}[/]")  # noqa: E731  (log lines go to stderr, with --json too: a CI log is never silent)
    if opts.triage or opts.worst is not None or opts.compare is not None:
        return _triage(opts, say, json)
    from ..validate.api import run_validation  # lazy: torch (registering the commands and --help import none)

    r = run_validation(checkpoint, target, opts, log=say)
    print_json(r) if json else render(r)
    if not r.passed:
        raise CheckFailed("; ".join(r.failures))
