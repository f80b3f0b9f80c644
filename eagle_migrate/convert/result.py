"""convert's typed results: what was inserted, how the norms were initialised, the agreement with the source, the
calibration status and the provenance record written next to the weights. Imports: pydantic, torch (its version),
the version string, stats, formats.aux_ids and target_fit (their result types)."""

from __future__ import annotations

import platform
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from .. import __version__
from ..formats.aux_ids import AuxIds, Measurement
from ..stats import TargetStatistics
from ..target_fit import TargetFit

Kind = Literal["plain", "speculators-style", "eagle2", "eagle3.1"]


class SourceKind(BaseModel):
    """The kind of source convert read, and where its ``norm_before_residual`` came from."""

    kind: Kind
    norm_before_residual: bool | None = Field(None, description="EAGLE-3 sources: the flag the conversion used")
    decided_by: str = Field("", description="config | measurement | override (--norm-before-residual) | layout default")
    meaning: str = ""


class FcNormWeight(BaseModel):
    layer_id: int
    chunk: int
    mean: float
    min: float
    max: float


class NormCandidate(BaseModel):
    """One fc_norm initialisation, measured against the source on held-out sequences."""

    method: str
    step0_agreement: float | None = Field(None, description="top-1 agreement of the step-0 draft with the source's")
    fc_rel_error: float | None = Field(None, description="E||g - g_src||^2 / E||g_src||^2, g = fc output")
    fc_cosine: float | None = Field(None, description="mean cosine between g and g_src (scale-free)")
    chosen: bool = False
    note: str | None = None


class FeedbackVariant(BaseModel):
    name: str
    description: str
    step_agreement: list[float] = Field(default_factory=list, description="top-1 agreement at steps 1..k")
    chosen: bool = False


class NormOutputCompensation(BaseModel):
    """How the switch of the fed-back state to the post-norm one was compensated."""

    applied: bool
    method: str = Field(..., description="fold-rms: norm.weight = R (flat), lm_head *= old_norm_weight / R")
    scale: float | None = Field(None, description="R, the typical RMS of the source's pre-norm output h_pre (position 0 excluded)")
    h_pre_rms_mean: float | None = None
    h_pre_rms_median: float | None = None
    norm_before_residual: bool
    exact: str = Field(..., description="when the compensation is exact")
    variants: list[FeedbackVariant] = Field(default_factory=list)


class Agreement(BaseModel):
    """Top-1 agreement between the converted drafter's drafts and the source's on held-out sequences."""

    step0: float | None = None
    steps: list[float] = Field(default_factory=list, description="steps 1..k of the draft chain (both drafters chain on their own drafts)")
    num_positions: int = 0
    num_chains: int = 0
    held_out_sequences: int = 0


class NormInit(BaseModel):
    method: str = Field(..., description="the fc_norm initialisation kept")
    fc_norm: list[FcNormWeight] = Field(default_factory=list)
    candidates: list[NormCandidate] = Field(default_factory=list)
    statistics: TargetStatistics | None = None
    notes: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list, description="fits the statistics could not determine, and why")


class CalibrationStatus(BaseModel):
    status: Literal["calibrated", "judged", "not calibrated"] = Field(
        "not calibrated", description="calibrated: the fine-tune ran (its best, or the initial weights, returned); judged: "
        "no fine-tune, the judge scored the conversion against the source; not calibrated: neither")
    required: bool = Field(False, description="the converted drafter needs the calibration fine-tune to be useful (EAGLE-2 sources)")
    reason: str = ""
    improved: bool | None = Field(None, description="the fine-tune beat the initialised drafter on the held-out suites beyond noise (None: not run)")
    worse_than_source: bool | None = Field(None, description="the returned drafter is below the source on a held-out suite beyond noise (None: not judged)")
    verdict: str | None = Field(None, description="one plain line: how the returned drafter compares with the source")
    details: dict[str, Any] | None = None


class Eagle2Mapping(BaseModel):
    """How an EAGLE-1/2 drafter was mapped onto the EAGLE-3.1 structure (docs/norm-init.md)."""

    aux_layer_ids: list[int]
    hidden_chunk: int = Field(..., description="fc chunk that carries the old fc's hidden half")
    embedding_rms: float
    fc_output_rms: float
    output_rms: float
    fc_bias: str
    notes: list[str] = Field(default_factory=list)


class Provenance(BaseModel):
    tool: str = "eagle-migrate"
    version: str = __version__
    command: str
    source: str
    source_sha256: str = Field(..., description="sha256 over the source's weight files (names and bytes)")
    source_files: list[str]
    source_format: str
    source_producer: str
    target: str
    target_name: str | None = Field(None, description="the target's name without its path: its Hub id, else a local folder's own name (fingerprints.target_name)")
    target_hub_id: str | None = Field(None, description="the target's Hub id when known (given, its config's _name_or_path, or an HF cache snapshot)")
    target_config_sha256: str | None = None
    data: str | None = None
    hidden_states_dir: str | None = None
    hidden_states_evidence: str | None = Field(None, description="how the layers of a --hidden-states folder that does "
                                               "not record them were verified (speculators-offline: the last slice)")
    num_sequences: int = 0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    output_format: str = "vllm"
    norm_init: str | None = None
    norm_output_scale: float | None = None
    calibration_required: bool = False
    calibration: str = "not calibrated"
    source_kind: str | None = Field(None, description="plain / speculators-style / eagle2 / eagle3.1 (convert/defaults.py)")
    calibration_verdict: str | None = None
    step0_agreement: float | None = Field(None, description="top-1 agreement of the converted drafter's step-0 drafts with the source's (before calibration)")
    statistics: TargetStatistics | None = None
    aux_ids: AuxIds | None = Field(None, description="stored aux ids, their convention and how it was decided")
    norm_before_residual_evidence: Measurement | None = Field(None, description="norm_before_residual measured on the "
                                                              "target (the config did not state it)")
    started_at: str
    finished_at: str | None = None
    target_fit: TargetFit | None = Field(None, description="whether the source fits this target (target_fit.py)")
    python: str = platform.python_version()
    torch: str = torch.__version__


class ConvertResult(BaseModel):
    """What ``convert`` did (printed by ``eagle-migrate convert --json``)."""

    source: str
    output: str
    source_format: str
    source_producer: str
    output_format: str
    passthrough: bool = Field(False, description="the source was already EAGLE-3.1 and was re-written as it is")
    inserted: list[str] = Field(default_factory=list, description="tensors and flags added")
    changes: list[str] = Field(default_factory=list, description="everything else that differs from the source")
    aux_layer_ids: list[int] = Field(default_factory=list)
    aux_ids_evidence: AuxIds | None = Field(None, description="stored ids, both readings, the decision and its evidence (a measurement's numbers)")
    norm_before_residual_evidence: Measurement | None = Field(None, description="norm_before_residual measured on the target")
    norm_init: NormInit | None = None
    norm_output: NormOutputCompensation | None = None
    eagle2_mapping: Eagle2Mapping | None = None
    agreement: Agreement = Field(default_factory=Agreement)
    calibration: CalibrationStatus = Field(default_factory=CalibrationStatus)
    calibration_required: bool = False
    output_files: list[str] = Field(default_factory=list)
    provenance: Provenance
    fixed: list[str] = Field(default_factory=list, description="the source's findings (inspect) that the output no "
                             "longer has: the conversion fixed them")
    source_kind: SourceKind | None = Field(None, description="plain / speculators-style / eagle2 / eagle3.1, and where "
                                           "its norm_before_residual came from")
    defaults: str = Field("", description="why the calibration step did what it did (convert/defaults.py)")
    decision: str = Field("", description="what the calibration step did and who decided it, in one short line: "
                          "'judged only (CPU default)', 'fine-tuned (--calibrate; recipe --train norms+fc --data drift)'")
    warnings: list[str] = Field(default_factory=list, description="what still needs attention, each with one label "
                                "(error: / warning: for the source's findings that the output still has)")
    target_fit: TargetFit | None = Field(None, description="whether the source fits this target: the config's "
                                         "evidence and step 0 on the target's own text (target_fit.py)")
