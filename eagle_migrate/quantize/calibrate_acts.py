"""Activation ranges for the static schemes: max |input| of each quantized Linear while the drafter drafts as vLLM
runs it, fed by the target's aux hidden states, on the calibration sequences of ``corpora.calibration_sequences``.

Imports: torch, pydantic, ``errors``, ``drafter`` (config, model), ``loader``, ``corpora``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

from ..corpora import calibration_sequences
from ..drafter.config import DrafterConfig
from ..drafter.model import KVCache
from ..errors import CheckpointError, DataError, InputError
from ..loader import build_drafter

DRAFT_STEPS = 3


class CalibrationReport(BaseModel):
    num_sequences: int
    num_tokens: int
    draft_steps: int = Field(..., description="draft steps run per sequence (every Linear sees step 0 and fed-back states)")
    source: str = Field(..., description="where the calibration sequences came from")


@torch.no_grad()
def calibrate_activations(
    drafter,
    target,
    sequences: list[list[int]],
    prefixes: list[str],
    *,
    draft_steps: int = DRAFT_STEPS,
    skip_first: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], int]:
    """max |input| of every Linear in ``prefixes`` while the drafter drafts over each sequence as vLLM runs it
    (step 0 over the context fed by the target's aux states, then ``draft_steps - 1`` fed-back steps).
    Position 0 carries a huge attention-sink activation in real targets (calibration-notes.md): it is left out."""
    cfg = drafter.cfg
    ids_layers = cfg.aux_layer_ids
    if ids_layers is None:
        raise InputError("the drafter's config has no aux layer ids; static calibration needs them",
                         "write eagle_aux_hidden_state_layer_ids into the drafter's config.json (convert does)")
    amax: dict[str, float] = {p: 0.0 for p in prefixes}
    modules = dict(drafter.named_modules())
    handles = []

    def hook(name):
        def fn(_m, args):
            amax[name] = max(amax[name], float(args[0].detach().abs().amax()))
        return fn

    for p in prefixes:
        if p not in modules:
            raise CheckpointError(f"no Linear named {p} in the drafter")
        handles.append(modules[p].register_forward_pre_hook(hook(p)))
    tokens = 0
    dtype = next(drafter.parameters()).dtype
    try:
        for i, seq in enumerate(sequences):
            if len(seq) < 3:
                continue
            ids = torch.tensor([seq], dtype=torch.long)
            aux, _ = target.forward(ids, ids_layers, logits_to_keep=1)  # the logits are not used
            aux = aux.to("cpu", dtype)
            start = 1 if skip_first and len(seq) > 3 else 0
            drafter.draft_with_cache(ids[:, start:], aux[:, start:-1], draft_steps, KVCache(), start_position=start)
            tokens += len(seq)
            if progress:
                progress(f"calibrating {i + 1}/{len(sequences)}")
    finally:
        for h in handles:
            h.remove()
    if tokens == 0:
        raise DataError("no calibration sequence has 3 tokens or more")
    return amax, tokens


def data_source(data: Any) -> str:
    """Where calibration sequences come from, as the report names it."""
    if isinstance(data, (list, tuple)):
        return "token ids given"
    return "builtin:chat" if data is None else str(data)


def activation_ranges(cfg: DrafterConfig, sd: dict[str, torch.Tensor], target, data: Any, prefixes: list[str], *,
                      num_sequences: int, max_len: int, progress: Callable[[str], None] | None = None
                      ) -> tuple[dict[str, float], CalibrationReport]:
    """The calibrated max |input| of each Linear in ``prefixes`` (``target``: a loaded ``target.Target``; ``data``:
    any source ``corpora.calibration_sequences`` reads, None = the built-in chat set) and what it was measured on."""
    seqs = calibration_sequences(data, getattr(target, "tokenizer", None), target.info.vocab_size, num_sequences, max_len)
    drafter = build_drafter(cfg, sd, target)  # float32 on the CPU, as the calibration runs
    amax, ntok = calibrate_activations(drafter, target, seqs, prefixes, progress=progress)
    return amax, CalibrationReport(num_sequences=len(seqs), num_tokens=ntok, draft_steps=DRAFT_STEPS,
                                   source=data_source(data))
