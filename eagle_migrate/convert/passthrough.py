"""EAGLE-3.1 -> EAGLE-3.1: the source is re-written as it is (aux ids explicit, rope and positions from the target);
no statistics, no agreement, calibrated only when asked. Imports: drafter.config, formats.aux_ids,
convert.{registry, read, write}."""

from __future__ import annotations

from ..drafter.config import DrafterConfig
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
