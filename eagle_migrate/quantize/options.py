"""quantize's options model: every option of :func:`eagle_migrate.quantize.quantize` in one checked object (the
drafter and the output folder are its arguments). Imports: pydantic, options (no torch)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional

from pydantic import Field

from ..options import Options

with warnings.catch_warnings():  # the field "validate" (quantize's --validate) shadows pydantic's deprecated classmethod
    warnings.filterwarnings("ignore", message='Field name "validate"', category=UserWarning)

    class QuantizeOptions(Options):
        """The options of :func:`eagle_migrate.quantize.quantize` (documented there). ``scheme`` None: nothing to
        quantize (``migrate`` runs no quantize stage; ``quantize()`` refuses it)."""

        RUN_FIELDS = {"num_speculative_tokens": "num_speculative_tokens"}  # the run-wide options it takes (options.RunOptions)

        scheme: Any = None  # a SchemeName, or a quant.SchemeConfig; checked by quant.get_scheme (the one check)
        target: Optional[str | Path] = None
        data: Any = None  # a data spec, or token-id lists
        quantize_fc: bool = False
        quantize_lm_head: bool = False
        num_calibration_sequences: int = 64
        calibration_max_len: int = 512
        force: bool = False
        max_al_drop_pct: Optional[float] = None
        validate: str = "auto"  # auto | vllm | reference | none ("off" = none): the gate's engine (gate.gate_engine)
        suites: Optional[dict[str, dict[str, Any]]] = None  # the gate's jobs (default: small chat and code suites)
        num_speculative_tokens: int = 3
        vllm_options: Optional[dict[str, Any]] = None  # the gate's vLLM run ("python": the interpreter, max_model_len, ...)
        device: Any = "cpu"  # auto resolves to cuda when present
        progress: Any = Field(None, exclude=True, repr=False)  # log lines (str), not an option
