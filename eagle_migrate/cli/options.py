"""Shared typed CLI options, defined once (the huggingface_hub CLI habit), and how a command's flags become its
stage's one options model.

Choices are the library's own Literals (:mod:`eagle_migrate.choices`): typer offers exactly their values and the
commands pass the strings on unchanged. Each command names its parameters as the fields of its options model
(the flag's spelling is the ``typer.Option``'s), declares in :data:`COMMANDS` which parameters are the stage's
inputs rather than options and which only the CLI reads, and builds the model with :func:`options_of`;
tests/unit/test_cli_options.py checks that every flag maps to a field. Nothing here imports torch (``--help`` and
``inspect`` stay fast).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..choices import AuxIdsConvention, Device, Dtype, OutputFormat, TrainMode


@dataclass(frozen=True)
class CommandOptions:
    """How one command's parameters map onto its stage: ``model`` (a function of the command's module, beside the
    command, that imports and returns the options model, or the library function the options go to: imported when
    the command runs, so --help imports none of them; None: no options), the parameters that are the stage's inputs
    (passed as arguments, not options), and those only the CLI reads, each with its reason."""

    model: Optional[Callable[[], Any]]
    inputs: tuple[str, ...] = ()
    cli_only: dict[str, str] = field(default_factory=lambda: {"json": "how the result is printed"})

    def load(self) -> Any:
        return self.model() if self.model is not None else None


COMMANDS: dict[str, CommandOptions] = {}  # command name -> its options mapping (each command module adds its own)


def options_of(command: str, params: dict[str, Any]) -> Any:
    """The options model of ``command`` built from its parameters ``params`` (the function's ``locals()`` at entry):
    every parameter but the inputs and the CLI-only ones is an option, passed by name (``Options.of``)."""
    spec = COMMANDS[command]
    skip = set(spec.inputs) | set(spec.cli_only)
    return spec.load().of(**{k: v for k, v in params.items() if k not in skip})

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
TrainOpt = Annotated[Optional[TrainMode], typer.Option("--train", help="What calibration updates: norms (the inserted and neighbouring norms), norms+fc, or all (EAGLE-2 sources need it). Default: norms+fc on --data drift for an EAGLE-3 source (the fine-tune that served a gain under drift; docs/calibration.md), all on 256 sequences for one that does not fit its target, norms otherwise.", show_default=False)]
MaxMinutesOpt = Annotated[Optional[float], typer.Option("--max-minutes", min=0.01, help="Wall-clock budget for the calibration fine-tune: the learning-rate schedule runs over the steps that fit in it at the pace so far and it is evaluated at each third of it (with --resume: over --steps, evaluated as without a budget); it stops after the step that runs past it (that step is evaluated; the best evaluation is kept). Default, for a drafter that does not fit its target on a CPU: the fine-tune ends 14.25 minutes into convert.")]
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
EngineOpt = Annotated[str, typer.Option("--engine", help="What serves the target (acceptance; calibration's held-out "
                                      "continuations): auto (vllm when importable) or a registered engine: vllm (real "
                                      "vLLM in a subprocess), reference (pure PyTorch; transformers' generate).")]
VllmPythonOpt = Annotated[Optional[str], typer.Option("--vllm-python", help="Python interpreter that has vLLM "
                                                      "(default: $EAGLE_MIGRATE_VLLM_PYTHON or this one).")]
# convert's flags that migrate forwards to convert
DataOpt = Annotated[Optional[str], typer.Option("--data", help="Calibration data: JSONL/JSON of prompts, chat messages or {\"token_ids\": [...]}, ShareGPT JSON, sharegpt, an HF dataset id (hf:ORG/NAME), drift[:KINDS] (long code and packed chat of 1k-4k tokens, other chat templates and system prompts, plain chat; never a validation suite's text), or answered[:SPEC] (the first requests of SPEC's conversations, answered by the target itself: its own text to train on); default: ShareGPT for a real target when installed, else the built-in set; a drafter that does not fit its target: answered (ShareGPT's first requests answered by the target).")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=0, help="Calibration fine-tune steps (asks for the fine-tune; 0: the judge alone, nothing trained).")]
LrOpt = Annotated[Optional[float], typer.Option("--lr", min=0.0, help="Calibration fine-tune peak learning rate "
                                                "(default per --train mode: docs/calibration.md).", show_default=False)]
KeepArchitectureOpt = Annotated[bool, typer.Option(
    "--keep-architecture", help="The control arm of a measurement: keep the EAGLE-3 source's architecture (no "
    "EAGLE-3.1 norms) and run the same calibration fine-tune on it (EAGLE-3 sources only).")]
CalibrateOpt = Annotated[Optional[bool], typer.Option("--calibrate/--no-calibrate", help="Run the calibration fine-tune after the structural conversion (default by kind of source: EAGLE-2 always; EAGLE-3 on a GPU, judged only on a CPU, but fine-tuned on a CPU too when it does not fit the target it is served with; EAGLE-3.1 never; docs/calibration.md). --no-calibrate: neither fine-tune nor judge.")]
FormatOpt = Annotated[OutputFormat, typer.Option("--output-format", help="Layout of the output: vllm (HF folder vLLM loads) or speculators.")]
QuantizeFcOpt = Annotated[bool, typer.Option("--quantize-fc", help="Quantize fc too (kept 16-bit by default: its input mixes K target states with outliers).")]
# validate's flags that migrate forwards to validate
SuiteOpt = Annotated[Optional[str], typer.Option("--suite", help="Comma-separated: chat, code, long, template-shift "
                                                 "(default: all four; only --prompts when that is given).")]
PromptsOpt = Annotated[Optional[Path], typer.Option("--prompts", help="Your own prompts: JSONL ({prompt} | {messages} | "
                                                    "{conversations} | {token_ids}) or a ShareGPT JSON file.")]
NumPromptsOpt = Annotated[Optional[int], typer.Option("--num-prompts", min=1, help="Prompts per suite (long: per length "
                                                      "bucket; template-shift: requests per variant).")]
MinAcceptanceLengthOpt = Annotated[Optional[float], typer.Option("--min-acceptance-length", min=1.0,
                                                                 help="Gate: every suite's AL must reach X (else exit 1).")]
MaxRegressionOpt = Annotated[Optional[float], typer.Option("--max-regression", help="Gate: no suite may lose more than PCT "
                                                           "percent AL against the baseline (validate: --baseline; "
                                                           "migrate: the source drafter) (else exit 1).")]
# publish's flags that migrate forwards to publish
PrivateOpt = Annotated[bool, typer.Option("--private", help="Create the repository private (an existing one keeps its visibility).")]
CreatePrOpt = Annotated[bool, typer.Option("--create-pr", help="Open a pull request instead of committing to the branch.")]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Branch to commit to (created if missing) or, with --create-pr, to open the PR against.")]
# inspect --target and convert: the target the drafter was trained for, measured as the reference of the target fit
TrainedForOpt = Annotated[Optional[str], typer.Option("--trained-for", metavar="MODEL", help="The target the drafter was "
                          "trained for (local folder or hub id): its step-0 agreement on that target's own text is the "
                          "reference against which the fit to --target is judged (else a fixed threshold; "
                          "docs/calibration.md \"Retargeting\").")]
