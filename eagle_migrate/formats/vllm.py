"""The vLLM layout (what ``vllm serve --speculative-config '{"method": "eagle3", ...}'`` loads): its config and tensor names
(the writer is ``formats/write.py``: ``write_vllm``, ``write_checkpoint``).

Written exactly per the emit checklist in docs/formats.md: the family's vLLM drafter architecture + ``model_type``
(per family: its ``vllm_arch`` + ``model_type``, its head keys, its attention tensors, the keys its vLLM drafter
does not read left out; eagle_migrate/families/); 3.1 flags at the top level; aux layer ids at the top level and
in ``eagle_config`` (+ ``num_aux_hidden_states`` when K != 3); no ``model.`` prefix; ``d2t`` iff Vd != V; never ``t2d``; ``tie_word_embeddings: false``.
"""

from __future__ import annotations

import json
from typing import Any

from .. import __version__, families
from ..drafter.config import DrafterConfig


def _family(cfg: DrafterConfig) -> families.Family:
    fam = families.find(cfg.architecture)
    if fam is None:
        raise ValueError(f"no vLLM layout for {cfg.architecture} drafters here (families: {', '.join(families.names())})")
    return fam


def rope_from_config(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config dict; transformers-5 ``rope_parameters`` understood."""
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        theta = theta if theta is not None else rp.get("rope_theta")
        rtype = rp.get("rope_type", rp.get("type", "default"))
        if scaling is None and rtype not in (None, "default"):
            scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def layer_config(cfg: DrafterConfig) -> dict[str, Any]:
    """The decoder-layer keys (``model_type`` .. ``vocab_size``, in this order) of the drafter's config, shared
    by the vLLM config.json and the speculators ``transformer_layer_config``; ``model_type`` and the head keys per
    family (``Family.model_type``, ``Family.head_config``: ``head_dim``, or a family's own sizes)."""
    fam = _family(cfg)
    d = {
        "model_type": fam.model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        **fam.head_config(cfg),
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,  # a family with its own rope type reads it as vLLM does (Family.rope)
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
    }
    if cfg.layer_types is not None:  # sliding-window layers, read back by drafter/config.py attention_windows_of
        # the default family's layer reads layer_types + sliding_window as given; other families' config classes keep
        # sliding_window only with use_sliding_window (and then take layer_types: Family.window_keys)
        d.update(layer_types=list(cfg.layer_types), sliding_window=cfg.sliding_window, use_sliding_window=True)
    return d


def vllm_config_dict(cfg: DrafterConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of the vLLM layout for an EAGLE-3/3.1 drafter."""
    if cfg.generation != "eagle3":
        raise ValueError("the vLLM eagle3 layout holds EAGLE-3 style drafters only")
    fam = _family(cfg)
    d: dict[str, Any] = {
        "architectures": [fam.vllm_arch],
        **layer_config(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": cfg.attention_bias,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_before_residual": cfg.norm_before_residual,
        "torch_dtype": "bfloat16",
    }
    for k in fam.unread_config_keys:  # keys the family's vLLM drafter does not read
        del d[k]
    if cfg.aux_layer_ids is not None:
        ids = sorted(cfg.aux_layer_ids)
        d["eagle_aux_hidden_state_layer_ids"] = ids
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    if cfg.num_aux != 3 or fam.always_num_aux:  # some families' drafters size fc from it, never the top-level ids
        d["num_aux_hidden_states"] = cfg.num_aux
    d["eagle_migrate"] = {"version": __version__}
    if extra:
        d.update(extra)
    return d


def vllm_tensor_names(cfg: DrafterConfig) -> list[str]:
    """Every tensor the vLLM loader needs for this config (it never complains about a missing one)."""
    names = ["fc.weight", "norm.weight", "lm_head.weight"]
    if cfg.fc_bias:
        names.append("fc.bias")
    if cfg.fc_norm:
        names += [f"fc_norm.{k}.weight" for k in range(cfg.num_aux)]
    if cfg.norm_before_fc:
        names.append("input_norm.weight")
    if cfg.uses_d2t:
        names.append("d2t")
    if cfg.has_embed_tokens or cfg.hidden_size != cfg.target_hidden_size:
        names.append("embed_tokens.weight")
    fam = _family(cfg)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        names += fam.attention_tensor_names(cfg, p)
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if i == 0:
            names.append(p + "hidden_norm.weight")
    return names


def speculative_config(model: str, num_speculative_tokens: int = 3) -> dict[str, Any]:
    """The ``--speculative-config`` dict vLLM takes for this drafter."""
    return {"model": model, "method": "eagle3", "num_speculative_tokens": num_speculative_tokens}


def speculative_config_json(model: str, num_speculative_tokens: int = 3) -> str:
    return json.dumps(speculative_config(model, num_speculative_tokens))
