"""Shared typed CLI options, defined once (the huggingface_hub CLI habit).

Choices are the library's own Literals (:mod:`eagle_migrate.choices`): typer offers exactly their values and the
commands pass the strings on unchanged. Nothing here imports torch (``--help`` and ``inspect`` stay fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..choices import AuxIdsConvention, Device, Dtype, TrainMode

CheckpointArg = Annotated[Path, typer.Argument(metavar="CKPT", help="Drafter checkpoint folder (or a single weights file).", show_default=False)]
OptionalCheckpointArg = Annotated[Optional[Path], typer.Argument(
    metavar="CKPT", show_default=False, help="Drafter checkpoint folder (or a single weights file); with --server "
    "optional, read only to record its aux ids, flags and hashes.")]
TargetOpt = Annotated[
    Optional[str], typer.Option("--target", "-t", metavar="MODEL", help="Target model: local folder or hub id (HF_HUB_OFFLINE honoured).")
]
RequiredTargetOpt = Annotated[str, typer.Option("--target", "-t", metavar="MODEL", help="Target model: local folder or hub id (HF_HUB_OFFLINE honoured).")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", metavar="DIR", help="Output folder (written atomically; see --force).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout (logs go to stderr).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace the output folder if it exists.")]
DeviceOpt = Annotated[Device, typer.Option("--device", help="auto uses CUDA when present.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="auto: bfloat16 on GPU, float32 on CPU.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (results are deterministic for a seed).")]
TrainOpt = Annotated[TrainMode, typer.Option("--train", help="What calibration updates: norms (the inserted and neighbouring norms), norms+fc, or all (EAGLE-2 sources need it).")]
MaxMinutesOpt = Annotated[Optional[float], typer.Option("--max-minutes", min=0.01, help="Wall-clock budget for the calibration fine-tune: it stops after the step that runs past it (that step is evaluated; the best evaluation is kept).")]
AuxIdsConventionOpt = Annotated[Optional[AuxIdsConvention], typer.Option(
    "--aux-ids-convention",
    help="How the drafter's stored aux layer ids are meant: vllm (residual stream after i layers, what vLLM reads) or "
         "output-of-layer (SpecForge/ModelOpt training: vLLM id = stored + 1). Overrides fingerprints and measurement; "
         "recorded in provenance.json.")]
NbrOpt = Annotated[Optional[bool], typer.Option(
    "--norm-before-residual/--no-norm-before-residual",
    help="Whether the drafter's layer 0 keeps hidden_norm(g) (true, speculators' default) or g (false: SafeAILab, "
         "SpecForge) as its residual, when its config does not say. Default: the config, else measured on the "
         "target; this overrides the measurement and is recorded.", show_default=False)]
NumSpecTokensOpt = Annotated[int, typer.Option("--num-speculative-tokens", "-k", min=1, max=16, help="Draft tokens per step (k).")]
