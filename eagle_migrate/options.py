"""Shared typed CLI options, defined once (the huggingface_hub CLI habit)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from .devices import resolve_device, resolve_dtype  # noqa: F401  (re-exported for the CLI modules)


class DeviceChoice(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DtypeChoice(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class OutputFormat(str, Enum):
    vllm = "vllm"
    speculators = "speculators"


class AuxIdsConventionChoice(str, Enum):
    """--aux-ids-convention: how stored eagle_aux_hidden_state_layer_ids are to be read (``aux_ids.Convention``)."""

    vllm = "vllm"
    output_of_layer = "output-of-layer"


class TrainChoice(str, Enum):
    """convert --train: what the calibration fine-tune updates (``calibrate.TRAIN_MODES``)."""

    norms = "norms"
    norms_fc = "norms+fc"
    all = "all"


class SchemeChoice(str, Enum):
    """quantize --scheme (the values of ``quantize.SchemeName``)."""

    fp8_dynamic = "fp8-dynamic"
    fp8 = "fp8"
    nvfp4a16 = "nvfp4a16"
    nvfp4 = "nvfp4"


class ValidateChoice(str, Enum):
    """quantize --validate: the engine that measures acceptance before/after, or none."""

    auto = "auto"
    vllm = "vllm"
    reference = "reference"
    none = "none"


CheckpointArg = Annotated[Path, typer.Argument(help="Drafter checkpoint folder (or a single weights file).", show_default=False)]
TargetOpt = Annotated[
    Optional[str], typer.Option("--target", "-t", help="Target model: local folder or hub id (HF_HUB_OFFLINE honoured).")
]
RequiredTargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target model: local folder or hub id (HF_HUB_OFFLINE honoured).")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Output folder (written atomically; see --force).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout (logs go to stderr).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace the output folder if it exists.")]
DeviceOpt = Annotated[DeviceChoice, typer.Option("--device", help="auto uses CUDA when present.")]
DtypeOpt = Annotated[DtypeChoice, typer.Option("--dtype", help="auto: bfloat16 on GPU, float32 on CPU.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (results are deterministic for a seed).")]
TrainOpt = Annotated[TrainChoice, typer.Option("--train", help="What calibration updates: norms (the inserted and neighbouring norms), norms+fc, or all (EAGLE-2 sources need it).")]
MaxMinutesOpt = Annotated[Optional[float], typer.Option("--max-minutes", min=0.01, help="Wall-clock budget for the calibration fine-tune: it stops after the step that runs past it (that step is evaluated; the best evaluation is kept).")]
AuxIdsConventionOpt = Annotated[Optional[AuxIdsConventionChoice], typer.Option(
    "--aux-ids-convention",
    help="How the drafter's stored aux layer ids are meant: vllm (residual stream after i layers, what vLLM reads) or "
         "output-of-layer (SpecForge/ModelOpt training: vLLM id = stored + 1). Overrides fingerprints and measurement; "
         "recorded in provenance.json.")]
NumSpecTokensOpt = Annotated[int, typer.Option("--num-speculative-tokens", "-k", min=1, max=16, help="Draft tokens per step (k).")]
