"""The speculators layout (vllm-project/speculators ``src/speculators/models/eagle3/``): read, and its config.json
(the files are written by ``formats/write.py``).

config.json has no ``model_type``; ``speculators_model_type: "eagle3"``; the decoder layer's HF config lives in
``transformer_layer_config`` (its ``vocab_size`` = target V); EAGLE fields at the top level
(``draft_vocab_size``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, ``norm_before_residual``,
``norm_before_fc``, ``fc_norm``, ``norm_output``); ``speculators_config`` carries the proposal method and the
verifier. Weights are ``layers.N.*`` (vLLM names); ``d2t``/``t2d`` only when Vd != V.

vLLM (``transformers_utils/configs/speculators/algos.py`` ``update_eagle3``) builds its HF config from
``transformer_layer_config`` and copies the top-level fields over it; ``norm_before_residual`` defaults to
**true** when absent, ``fc_norm``/``norm_output`` are read from the top level (0.25+) and overwrite whatever
``transformer_layer_config`` says. Aux ids are copied literally: in vLLM's convention when speculators' trainer
(``Eagle3DraftModel``) or eagle-migrate wrote them; ``speculators convert`` (``Eagle3Speculator``) copies a source's ids
unchanged, so those are measured with a target (docs/formats.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import __version__, families
from ..drafter.config import DrafterConfig
from ..errors import CheckpointError
from .base import Checkpoint, Layout, Probe, register_layout
from .common import ConfigView, derive, our_fingerprint, quant_scheme
from .traps import finding
from .vllm import layer_config

if TYPE_CHECKING:  # the reader runs on headers alone (inspect never imports torch)
    import torch

EAGLE_FIELDS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc", "fc_norm",
                "norm_output", "eagle_aux_hidden_state_layer_ids")


def _sniff(p: Probe) -> int:
    return 100 if (p.config or {}).get("speculators_model_type") is not None else 0


def speculators_view(cfg: dict[str, Any]) -> ConfigView:
    smt = cfg.get("speculators_model_type")
    if smt != "eagle3":
        raise CheckpointError(f"speculators_model_type '{smt}' is not an EAGLE-3 speculator (only 'eagle3' is read)",
                              "eagle-migrate reads speculators EAGLE-3 drafters only")
    tlc = cfg.get("transformer_layer_config")
    if tlc is None:
        tlc = {}
    if not isinstance(tlc, dict):
        raise CheckpointError(f"transformer_layer_config must be a JSON object, found {type(tlc).__name__}")
    flat = dict(tlc)
    nested: dict[str, str] = {}
    for k in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual"):
        if k in tlc and k not in cfg:
            nested[k] = "transformer_layer_config"
            flat.pop(k, None)  # vLLM 0.25+ overwrites them with the top-level value (or its default)
    for k in EAGLE_FIELDS:
        if k in cfg:
            flat[k] = cfg[k]
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, found {ids!r}")
    if isinstance(cfg.get("eagle_migrate"), dict):
        fp = our_fingerprint(cfg)
    elif "Eagle3DraftModel" in (cfg.get("architectures") or []):
        fp = ("vllm", "speculators_model_type + Eagle3DraftModel: written by speculators' trainer, which captures at vLLM's ids")
    else:
        fp = None  # Eagle3Speculator: `speculators convert` copies the source's ids unchanged
    notes = {"vllm": ["speculators configs are read by vLLM with the ids copied literally"],
             "output-of-layer": ["`speculators convert` (Eagle3Speculator) copies a SpecForge/SafeAILab source's ids unchanged"]}
    return ConfigView(flat, ids if ids else None, "top-level" if ids else "none", fp, True, nested, notes)


def _read(p: Probe) -> Checkpoint:
    cfg = p.config or {}
    view = speculators_view(cfg)
    producer = "eagle-migrate" if isinstance(cfg.get("eagle_migrate"), dict) else "speculators"
    ck = derive(p.folder, p.store, p.scan, view, producer=producer, layout="speculators", raw_config=p.config,
                quantization=quant_scheme(cfg) or quant_scheme(cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else None))
    for k, loc in view.nested_flags.items():
        if k in ("fc_norm", "norm_output"):
            ck.findings.append(finding("error", "flag_nested_only", f"{k} is set only in {loc}: vLLM >= 0.25 overwrites it with the top-level value (default false); vLLM < 0.25 ignores it"))
        elif k == "norm_before_residual":
            ck.findings.append(finding("error", "flag_nested_only", f"norm_before_residual is only in {loc}: vLLM uses the top-level value, default true"))
    if "norm_before_residual" not in cfg:
        ck.findings.append(finding("warning", "norm_before_residual_implicit", "speculators config without norm_before_residual: vLLM assumes true; make sure the drafter was trained that way"))
    if ck.config.fc_norm or ck.config.norm_output:
        ck.findings.append(finding("info", "speculators_31_flags_version", "EAGLE-3.1 flags in the speculators format are honoured only by vLLM >= 0.25 (PR #46488)"))
    sc = cfg.get("speculators_config")
    try:
        _ = sc["proposal_methods"][0]["speculative_tokens"]
        _ = sc["verifier"]["name_or_path"]
    except (KeyError, IndexError, TypeError):
        ck.findings.append(finding("error", "speculators_config_invalid", "speculators_config lacks proposal_methods[0].speculative_tokens or verifier.name_or_path: vLLM rejects it ('Invalid speculators config structure')"))
    if cfg.get("transformer_layer_config") is None:
        ck.findings.append(finding("error", "speculators_config_invalid", "no transformer_layer_config: vLLM rejects it"))
    ck.meta["verifier"] = (sc or {}).get("verifier") if isinstance(sc, dict) else None
    return ck


SPECULATORS = register_layout(Layout("speculators", "speculators", _sniff, _read, "vllm-project/speculators EAGLE-3 (speculators_model_type: eagle3)"))


# ----- config.json of the layout (formats/write.py writes the files) -------------------------------------------
def speculators_config_dict(
    cfg: DrafterConfig,
    *,
    verifier: str | None = None,
    verifier_architectures: list[str] | None = None,
    num_speculative_tokens: int = 3,
    dtype: torch.dtype | str | None = "bfloat16",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if cfg.generation != "eagle3":
        raise ValueError("the speculators eagle3 layout holds EAGLE-3 style drafters only")
    hf_arch = families.get(cfg.architecture).hf_arch
    tlc: dict[str, Any] = {
        "architectures": [hf_arch],
        **layer_config(cfg),
        "tie_word_embeddings": False,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": False,
    }
    if cfg.num_aux != 3:
        tlc["num_aux_hidden_states"] = cfg.num_aux
    if cfg.aux_layer_ids is not None:
        tlc["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sorted(cfg.aux_layer_ids), "use_aux_hidden_state": True}
    d: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": tlc,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{
                "proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                "verifier_accept_k": 1, "accept_tolerance": 0.0,
            }],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures or [hf_arch])},
        },
        "torch_dtype": str(dtype).removeprefix("torch.") if dtype is not None else "float32",
        "eagle_migrate": {"version": __version__},
    }
    if cfg.aux_layer_ids is not None:
        d["eagle_aux_hidden_state_layer_ids"] = sorted(cfg.aux_layer_ids)
    if extra:
        d.update(extra)
    return d
