"""EAGLE-3.1 -> EAGLE-3.1: the source is re-written as it is (aux ids explicit, rope and positions from the target);
no statistics, no agreement, calibrated only when asked. And the control arm of a measurement (``convert
--keep-architecture``, :class:`KeepArchitecture`): an EAGLE-3 source re-written as EAGLE-3 (no 3.1 norms), then the
same fine-tune a conversion runs. Imports: drafter.config, errors, formats.aux_ids, convert.{registry, read, write}."""

from __future__ import annotations

from ..drafter.config import DrafterConfig
from ..errors import InputError
from ..formats.aux_ids import AuxIds
from .read import Job, decide_aux_ids
from .registry import Converter, Initialised, Traits, register_converter
from .write import OutputPlan, copy_from


@register_converter
class PassthroughConverter(Converter):
    name = "passthrough"
    traits = Traits(passthrough=True, uses_data=False, calibrate_by_default=False)

    @classmethod
    def accepts(cls, cfg: DrafterConfig) -> bool:
        return cfg.is_eagle31

    def aux_ids(self, job: Job) -> tuple[AuxIds | None, list[int]]:
        """The layout and how vLLM reads the ids stay: undecided ids are carried verbatim (marked undecided)."""
        return decide_aux_ids(job, measure=False)

    def init(self, job: Job) -> Initialised:
        plan = OutputPlan(job.cfg.model_copy(update=job.update))
        copy_from(job.ck, plan)
        plan.changes = ["source already EAGLE-3.1: weights and flags re-written as they are"]
        return Initialised(plan)


@register_converter
class KeepArchitecture(Converter):
    """``convert --keep-architecture``: the control arm of the 3.1 conversion. The EAGLE-3 source is written as it
    is (no fc_norm, norm_output off; aux ids decided as a conversion decides them), and the calibration runs on it
    with the same data, steps, trainable set and learning rate (``--train norms`` trains the source's own norms),
    judged against the source. Without it no one can tell what the 3.1 norms did from what the fine-tune did.
    Registered by name only: asked for (``converter_for(cfg, "keep-architecture")``), never picked by ``"auto"``."""

    name = "keep-architecture"
    traits = Traits(judged_against_source=True)
    by_name_only = True

    @classmethod
    def accepts(cls, cfg: DrafterConfig) -> bool:
        return cfg.generation == "eagle3" and not cfg.is_eagle31

    @classmethod
    def refusal(cls, cfg: DrafterConfig) -> InputError:
        """A source that has no EAGLE-3 architecture to keep (exit 2)."""
        what = "already EAGLE-3.1" if cfg.is_eagle31 else f"an {cfg.generation} drafter"
        return InputError(f"--keep-architecture: the source is {what}; it keeps the architecture of EAGLE-3 sources "
                          "only (the control arm of their 3.1 conversion)",
                          "drop --keep-architecture" + (", or pass --calibrate to fine-tune it as it is"
                                                        if cfg.is_eagle31 else ""))

    def init(self, job: Job) -> Initialised:
        plan = OutputPlan(job.cfg.model_copy(update=job.update))
        copy_from(job.ck, plan)
        plan.changes = ["--keep-architecture: the EAGLE-3 architecture kept (no fc_norm, norm_output off), the "
                        "calibration fine-tune run on it as on a conversion (the control arm)"]
        return Initialised(plan)
