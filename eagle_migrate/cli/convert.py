from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import (
    COMMANDS,
    AuxIdsConventionOpt,
    CalibrateOpt,
    CheckpointArg,
    CommandOptions,
    DataOpt,
    FormatOpt,
    StepsOpt,
    DeviceOpt,
    DtypeOpt,
    EngineOpt,
    ForceOpt,
    JsonOpt,
    KeepArchitectureOpt,
    LrOpt,
    MaxMinutesOpt,
    NbrOpt,
    NumSpecTokensOpt,
    OutputOpt,
    RequiredTargetOpt,
    SeedOpt,
    TrainedForOpt,
    TrainOpt,
    VllmPythonOpt,
    options_of,
)
from .render import StageBar, evidence_rows, print_json, stdout

HiddenStatesOpt = Annotated[Optional[Path], typer.Option("--hidden-states", help="Precomputed target hidden states instead of running the target, never loaded whole then (speculators prepare-data folder with hidden_states/ or data_*.pt, SpecForge *.ckpt, eagle-migrate; docs/scale.md).")]
NumSeqOpt = Annotated[Optional[int], typer.Option("--num-sequences", "-n", min=2, show_default=False, help="Calibration sequences (default 32; 256 for the default recalibration of a drafter that does not fit its target). Norm statistics use at most 256 of them (32 on a CPU), a quarter of those up to 16 held out for the agreement.")]
RequireImprovementOpt = Annotated[bool, typer.Option("--require-improvement", help="Exit 1 (output still written) when calibration does not beat the initialised drafter beyond noise, or the result is below the source beyond noise.")]
CacheDirOpt = Annotated[Optional[Path], typer.Option("--cache-dir", help="Keep the target's hidden states for calibration on disk here (reused by later runs).")]
HeldoutLongOpt = Annotated[Optional[int], typer.Option("--heldout-long", min=1, help="Long documents per length bucket in the calibration judge's long suite (default 8 on a CPU, of 1k and 2k tokens; 4 on a GPU, of 1k to 8k). The judge's pooled score is the mean of its suites, and the long suite is the smallest: more documents let it see a long-context gain, at the cost of longer held-out generation.")]
ResumeOpt = Annotated[Optional[Path], typer.Option("--resume", help="Folder for the calibration's checkpoints; a run interrupted with the same folder continues from its last saved step.")]


def options_model():
    """The command's options model (ConvertOptions), imported when the command runs."""
    from ..convert.options import ConvertOptions  # lazy: the options model's package stays out of --help

    return ConvertOptions


COMMANDS["convert"] = CommandOptions(options_model, inputs=("source", "target", "out"))


def convert(
    source: CheckpointArg,
    target: RequiredTargetOpt,
    out: OutputOpt,
    data: DataOpt = None,
    hidden_states_dir: HiddenStatesOpt = None,
    num_sequences: NumSeqOpt = None,
    steps: StepsOpt = None,
    lr: LrOpt = None,
    max_minutes: MaxMinutesOpt = None,
    calibrate: CalibrateOpt = None,
    train: TrainOpt = None,
    require_improvement: RequireImprovementOpt = False,
    cache_dir: CacheDirOpt = None,
    resume_dir: ResumeOpt = None,
    heldout_long_per_bucket: HeldoutLongOpt = None,
    output_format: FormatOpt = "vllm",
    aux_ids_convention: AuxIdsConventionOpt = None,
    norm_before_residual: NbrOpt = None,
    keep_architecture: KeepArchitectureOpt = False,
    num_speculative_tokens: NumSpecTokensOpt = 3,
    engine: EngineOpt = "auto",
    vllm_python: VllmPythonOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    trained_for: TrainedForOpt = None,
    json: JsonOpt = False,
) -> None:
    """Convert an EAGLE-2 / EAGLE-3 drafter to EAGLE-3.1 (fc_norm + norm_output) in the layout vLLM loads.

    The new norms are initialised from the target's hidden-state statistics so that the converted drafter drafts
    like the source before any training; the report gives the step-0..k top-1 agreement with the source on
    held-out sequences, what was inserted and how the norms were initialised. EAGLE-2 sources become a warm start
    that needs the calibration fine-tune. The source is never modified; the output appears atomically.

    Stored aux layer ids that can be read two ways (vLLM's convention or output-of-layer) are decided by a
    fingerprint of the writer, else by measuring on the target the drafter's step-0 log-likelihood of the target's
    next token under each reading (paired, sequential): a winner decides; readings shown equivalent keep the stored
    ids (with a warning); when the evidence is inconclusive, convert stops (exit 2): pass --aux-ids-convention.
    An EAGLE-3.1 source (passthrough) keeps undecided ids as stored, marked undecided.

    It says whether the drafter fits the target: the target its config names, and its step-0 agreement with the
    target's greedy next token on the target's own text (against --trained-for's when given). A drafter that does not
    fit, or whose fit to a model it was not trained for the measurement cannot tell, is fine-tuned by default, on a
    CPU too (a wall-clock budget there); the judge keeps the fine-tune only when it beats the structural conversion
    beyond noise. --data FILE.jsonl of served prompts: a held-out part (by content
    hash) is the judge's own suite "traffic", the rest is answered by the target and trained on.

    Exit codes: 0 ok, 1 --require-improvement and calibration did not improve the drafter, 2 bad input (unreadable
    checkpoint, drafter/target mismatch, undecidable aux-id convention, existing output without --force).

    Example: eagle-migrate convert ./eagle3-ckpt --target ./Llama-3.1-8B-Instruct -o ./eagle31
    """
    # -n not given: the options' default (and a retarget's recipe may set it), not a value the user chose
    opts = options_of("convert", {k: v for k, v in locals().items() if not (k == "num_sequences" and v is None)})
    from ..convert import check_improvement  # lazy: torch (registering the commands and --help import none)
    from ..convert.base import run  # lazy: torch

    cmd = " ".join(["eagle-migrate"] + [shlex.quote(a) for a in sys.argv[1:]])
    with StageBar("convert", json) as prog:
        res = run(source, target, out, opts.replace(command=cmd, progress=prog))
    if json:
        print_json(res)
    else:
        render_result(res)
    if opts.require_improvement:
        check_improvement(res)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _label(line: str) -> tuple[str, str]:
    """A warning line as (label, text): its own ``error:`` / ``warning:`` / ``info:`` prefix is the label (never
    ``warning | warning: ...``); a line without one is a warning."""
    head, sep, rest = line.partition(": ")
    return (head, rest) if sep and head in ("error", "warning", "info") else ("warning", line)


def suite_rows(details: dict) -> list[tuple[str, str]]:
    """Per held-out suite of the judge: simulated AL before -> after (the source's), and the returned drafter minus
    the source, paired on the same positions (``gain vs source``)."""
    vs = ((details.get("judge") or {}).get("vs_source") or {}).get("suites") or {}
    rows = []
    for name, su in (details.get("suites") or {}).items():
        b, a, s = (su.get(x) or {} for x in ("before", "after", "source"))
        line = f"AL {b.get('acceptance_length', float('nan')):.3f} -> {a.get('acceptance_length', float('nan')):.3f}"
        if s:
            line += f" (source {s['acceptance_length']:.3f})"
        if name in vs:
            d = vs[name]
            line += f"; gain vs source {d['diff']:+.3f} +/- {d['se']:.3f} ({100 * d['relative']:+.1f} %)"
        rows.append((f"suite {name}", line + f"; {su.get('num_sequences', '?')} sequences"))
    return rows


def render_result(r) -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    t = Table(title=f"{r.source} -> {r.output}", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    t.add_row("source", f"{r.source_format} ({r.source_producer})" + ("  [passed through]" if r.passthrough else ""))
    t.add_row("output", f"eagle3.1, {r.output_format} layout: {', '.join(r.output_files)}")
    if r.source_kind is not None:
        sk = r.source_kind
        t.add_row("kind of source", sk.kind + (f" (norm_before_residual {str(sk.norm_before_residual).lower()}, from the "
                                               f"{sk.decided_by})" if sk.norm_before_residual is not None else "")
                  + (f": {sk.meaning}" if sk.meaning else ""))
    ev = r.aux_ids_evidence
    how = f"  (stored {ev.stored}, {ev.convention or 'undecided'} by {ev.decided_by})" if ev is not None and ev.stored is not None else ""
    t.add_row("aux layer ids", str(r.aux_layer_ids) + how)
    for k, v in evidence_rows(ev, r.norm_before_residual_evidence):
        t.add_row(k, v)
    if r.inserted:
        t.add_row("inserted", "\n".join(r.inserted))
    if r.changes:
        t.add_row("changes", "\n".join(r.changes))
    if r.norm_init is not None:
        ni = r.norm_init
        t.add_row("fc_norm init", ni.method + "  " + ", ".join(f"layer {w.layer_id}: {w.mean:.4g}" for w in ni.fc_norm))
        if ni.candidates:
            t.add_row("candidates (step-0 agreement)", "\n".join(
                f"{'*' if c.chosen else ' '} {c.method}: {_pct(c.step0_agreement)}"
                + (f", fc rel. error {c.fc_rel_error:.3g}" if c.fc_rel_error is not None else "") for c in ni.candidates))
        if ni.statistics is not None:
            st = ni.statistics
            t.add_row("target statistics", f"{st.num_sequences} sequences, {st.num_tokens} tokens (position 0 excluded)\n" + "\n".join(
                f"layer {ls.layer_id}: RMS mean {ls.rms_mean:.4g}, median {ls.rms_median:.4g}"
                + (f", position 0: {ls.rms_first_position:.4g}" if ls.rms_first_position is not None else "") for ls in st.layers))
    if r.norm_output is not None:
        no = r.norm_output
        lines = [f"{'*' if v.chosen else ' '} {v.name}: steps 1..k {', '.join(_pct(a) for a in v.step_agreement)}" for v in no.variants]
        t.add_row("norm_output", f"{no.method}" + (f" (R = {no.scale:.4g})" if no.scale else "") + ("\n" + "\n".join(lines) if lines else ""))
    a = r.agreement
    if a.step0 is not None:
        t.add_row("agreement with source", f"step 0: {_pct(a.step0)}; steps 1..{len(a.steps)}: {', '.join(_pct(x) for x in a.steps)}"
                  f"  ({a.held_out_sequences} held-out sequences, {a.num_positions} positions, {a.num_chains} chains)")
    if r.target_fit is not None:
        t.add_row("target fit", f"{r.target_fit.verdict}: {r.target_fit.message}")
    cal = r.calibration
    if r.decision:
        t.add_row("decision", r.decision)
    t.add_row("calibration", f"{cal.status}" + (" (REQUIRED)" if r.calibration_required else "") + (f": {cal.reason}" if cal.reason else ""))
    if r.defaults and r.defaults not in (cal.reason or ""):
        t.add_row("why", r.defaults)
    if cal.verdict:
        t.add_row("vs source", cal.verdict)
    j = (cal.details or {}).get("judge")
    if j:
        t.add_row("judge", f"{j['heldout_drafts']} held-out drafts ({j['heldout_positions']} positions, "
                  f"{j['heldout_sequences']} sequences)"
                  + (f"; training set {j['training_tokens']} tokens" if j.get("training_tokens") is not None else "")
                  + (f"; statistics {j['statistics_tokens']} tokens" if j.get("statistics_tokens") is not None else ""))
    for k, v in suite_rows(cal.details or {}):
        t.add_row(k, v)
    for w in r.fixed:
        t.add_row("fixed", w)
    for w in r.warnings:
        t.add_row(*_label(w))
    stdout.print(t)
    stdout.print(f"serve: vllm serve {r.provenance.target} --speculative-config "
                 f"'{{\"model\": \"{r.output}\", \"method\": \"eagle3\", \"num_speculative_tokens\": 3}}'", highlight=False)
