"""The library's closed sets of option values, one ``Literal`` each (stdlib only: no torch, no typer).

The stage functions take these values as plain strings and the CLI (``cli/options.py``) offers exactly these
choices, so a value added here is a value every layer accepts.
"""

from __future__ import annotations

from typing import Literal, get_args

Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
OutputFormat = Literal["vllm", "speculators"]  # convert's output layout
TrainMode = Literal["norms", "norms+fc", "all"]  # what the calibration fine-tune updates
SchemeName = Literal["fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"]  # quantize --scheme
# --engine (validate, convert, migrate, demo) and quantize --validate are open: auto (and none) or a registered
# engine's name (engines.in_process.in_process_engines), checked where the engine is resolved
AuxIdsConvention = Literal["vllm", "output-of-layer"]  # how stored aux layer ids are read (aux_ids.Convention)


def values(choice) -> tuple[str, ...]:
    """The values of one of the Literals above, in order."""
    return get_args(choice)


TRAIN_MODES: tuple[str, ...] = values(TrainMode)  # the one tuple of --train modes (calibrate re-exports it)
