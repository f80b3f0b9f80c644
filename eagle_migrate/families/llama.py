"""The Llama family: vLLM's ``Eagle3LlamaForCausalLM`` / ``LlamaForCausalLMEagle3`` (``llama_eagle3.py``), the generic
EAGLE-3 decoder layer that speculators and SpecForge train for targets of every family. Its layer is
:class:`~eagle_migrate.families.base.Family`'s defaults (q/k/v/o projections, grouped-query heads, neox rope, the
attention of ``families/layers.py``), so the family is its row alone."""

from __future__ import annotations

from .base import Family, FamilyRow

ROW = FamilyRow(
    name="llama",
    title="Llama",
    vllm_arch="LlamaForCausalLMEagle3",
    model_type="llama",
    hf_arch="LlamaForCausalLM",
    # the architectures vLLM's registry maps to the Llama EAGLE-3 drafter, plus the plain model name trainers write
    config_archs=("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM"),
    config_model_types=("llama",),
    eagle3_archs=("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"),
    inspect_measures_aux_ids=True,
)

LLAMA = Family(ROW)
