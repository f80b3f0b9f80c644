"""The traps ``derive`` finds in a drafter checkpoint, one small check per topic, in the order they are reported.

Each check reads the derived :class:`~eagle_migrate.formats.sizes.WeightSizes` (what the weights say) and the config, and
returns findings made by :func:`~eagle_migrate.formats.traps.finding` (the one table of codes and severities).
"""

from __future__ import annotations

from typing import Any

from ..drafter.config import mla_rope_type_of, rope_parameters_of
from .base import Finding
from .sizes import ConfigValues, WeightSizes, cfg_flag, cfg_int
from .traps import finding

QWEN3_DEFAULT_HEAD_DIM = 128  # transformers' Qwen3Config default, which vLLM uses when the config has no head_dim
CPU_MLA_WIDTH = 576  # vLLM's CPU MLA kernels: kv_lora_rank + qk_rope_head_dim must be 512 + 64


def hidden_size_checks(s: WeightSizes, flat: dict[str, Any]) -> list[Finding]:
    """config hidden_size / target_hidden_size / num_aux_hidden_states against the weights (H, Ht, K)."""
    out: list[Finding] = []
    h_cfg = cfg_int(flat, "hidden_size")
    if h_cfg is not None and h_cfg != s.hidden_size:
        out.append(finding("error", "hidden_size_mismatch", f"config hidden_size={h_cfg} but the weights have H={s.hidden_size}; vLLM builds the drafter from the config and fails or mis-loads"))
    if s.generation != "eagle3":
        return out
    ht_cfg, fcn0, h, ht, fc_in = s.target_hidden_size_config, s.fc_norm0_shape, s.hidden_size, s.target_hidden_size, s.fc_in_features
    if fcn0 is not None and ht_cfg is not None and ht_cfg != fcn0[0]:
        out.append(finding("error", "target_hidden_size_mismatch", f"config target_hidden_size={ht_cfg} but fc_norm.0.weight is [{fcn0[0]}]"))
    ht0 = fcn0[0] if fcn0 is not None else (ht_cfg or h)
    if fc_in % ht0:
        out.append(finding("error", "fc_width_not_multiple", f"fc input width {fc_in} is not a multiple of Ht={ht0}: vLLM cannot build fc for this drafter"))
    if s.target_hidden_from_ids:
        out.append(finding("warning", "target_hidden_size_missing", f"config has no target_hidden_size; Ht={ht} inferred from fc width {fc_in} and {s.num_aux} aux ids"))
    if ht != h and ht_cfg is None and fcn0 is None:
        out.append(finding("warning", "target_hidden_size_missing", f"Ht={ht} differs from H={h} but the config has no target_hidden_size: vLLM will size fc as K*H"))
    if ht_cfg is None and fcn0 is not None and ht != h:
        out.append(finding("error", "target_hidden_size_missing", f"fc_norm weights are [{ht}] (= Ht) but the config has no target_hidden_size: vLLM would build fc and fc_norm for H={h}"))
    if s.num_aux != 3 and cfg_int(flat, "num_aux_hidden_states") is None and flat.get("_eagle_config_num_aux") != s.num_aux:
        out.append(finding("warning", "num_aux_missing", f"K={s.num_aux} aux states but no num_aux_hidden_states in the config: vLLM builds fc for 3 (vllm#54526)"))
    return out


def head_checks(s: WeightSizes, flat: dict[str, Any]) -> list[Finding]:
    """config head sizes against the weights (MLA: every MLA size)."""
    out: list[Finding] = []
    if s.mla:
        for k, v in {"num_attention_heads": s.num_heads, **s.mla_sizes}.items():
            c = cfg_int(flat, k)
            if c is not None and v is not None and c != v:
                out.append(finding("error", "mla_size_mismatch", f"config {k}={c} but the weights say {v}: vLLM builds the drafter from the config"))
        return out
    hd_cfg, nh_cfg, nkv_cfg = cfg_int(flat, "head_dim"), cfg_int(flat, "num_attention_heads"), cfg_int(flat, "num_key_value_heads")
    if s.head_dim_guessed:
        out.append(finding("info", "head_dim_guessed", f"no usable head_dim / num_attention_heads in the config: head_dim={s.head_dim} guessed from q/k widths {s.q_proj_rows}/{s.kv_proj_rows}"))
    if hd_cfg and hd_cfg != s.head_dim:
        out.append(finding("error", "head_dim_mismatch", f"config head_dim={hd_cfg} does not fit q/k widths {s.q_proj_rows}/{s.kv_proj_rows} (head_dim {s.head_dim} does)"))
    if nh_cfg and nh_cfg != s.num_heads:
        out.append(finding("error", "num_heads_mismatch", f"config num_attention_heads={nh_cfg} but the weights have {s.num_heads} heads of {s.head_dim}"))
    if nkv_cfg and nkv_cfg != s.num_kv_heads:
        out.append(finding("error", "num_kv_heads_mismatch", f"config num_key_value_heads={nkv_cfg} but the weights have {s.num_kv_heads}"))
    return out


def qwen3_checks(s: WeightSizes, flat: dict[str, Any], layout: str) -> list[Finding]:
    """The Qwen3 family's traps: q_norm/k_norm weights against the config's family, head_dim defaults."""
    from .sizes import config_family

    out: list[Finding] = []
    if s.mla:
        return out
    cfg_fam, why = config_family(flat, layout)
    if s.qk_norm_layers and cfg_fam == "llama":
        out.append(finding("error", "family_mismatch", f"the config says a Llama drafter ({why}) but the weights carry q_norm/k_norm (a Qwen3 layer): vLLM's Llama drafter has no such parameters; convert writes it as Eagle3Qwen3ForCausalLM"))
    elif not s.qk_norm_layers and cfg_fam == "qwen3":
        out.append(finding("error", "qk_norm_weights_missing", f"a Qwen3 drafter ({why}) without self_attn.q_norm/k_norm weights: vLLM loads all-ones norms without a word, which changes attention unless the drafter was trained so; if it was trained as a Llama layer, it must be written as LlamaForCausalLMEagle3"))
    if s.family != "qwen3":
        return out
    missing = [f"layers.{i}.self_attn.{x}_norm.weight" for i in range(s.num_layers) for x in "qk" if (i, x) not in s.qk_norm_layers]
    if s.qk_norm_layers and missing:
        out.append(finding("error", "qk_norm_weights_incomplete", f"missing {', '.join(missing)}: vLLM silently uses all-ones norms for them"))
    hd_cfg = cfg_int(flat, "head_dim")
    if hd_cfg is None and flat and s.head_dim != QWEN3_DEFAULT_HEAD_DIM:
        out.append(finding("error", "head_dim_missing", f"a Qwen3 drafter with head_dim {s.head_dim} but no head_dim in the config: vLLM builds it with Qwen3Config's default {QWEN3_DEFAULT_HEAD_DIM}"))
    if s.num_heads and s.head_dim * s.num_heads != s.hidden_size:
        out.append(finding("info", "head_dim_not_hidden_over_heads", f"head_dim {s.head_dim} != H/heads = {s.hidden_size}/{s.num_heads}: taken from the {'config' if hd_cfg else 'q_norm width'}, written explicitly"))
    return out


def vocab_checks(s: WeightSizes, flat: dict[str, Any]) -> list[Finding]:
    """V / Vd against the config; lm_head and d2t as vLLM loads them."""
    out: list[Finding] = []
    v, vd, e3 = s.vocab_size, s.draft_vocab_size, s.generation == "eagle3"
    v_cfg, vd_cfg = cfg_int(flat, "vocab_size"), cfg_int(flat, "draft_vocab_size")
    if v_cfg is not None and v_cfg != v:
        out.append(finding("error", "vocab_size_mismatch", f"config vocab_size={v_cfg} but the weights say V={v}"))
    if vd_cfg is not None and vd is not None and vd_cfg != vd:
        out.append(finding("error", "draft_vocab_size_mismatch", f"config draft_vocab_size={vd_cfg} but lm_head has {vd} rows: vLLM fails with a size mismatch (EAGLE#249)"))
    if vd > v:
        out.append(finding("error", "draft_vocab_exceeds_vocab", f"draft vocab Vd={vd} > target vocab V={v}"))
    if e3 and s.lm_head_shape is None:
        sev = "error" if vd != v else "warning"
        out.append(finding(sev, "no_lm_head", "no lm_head.weight: vLLM shares the target's head" + (" (valid only when Vd = V)" if vd != v else ", which is only right if the drafter was trained with it")))
    if e3 and vd != v and s.d2t_shape is None:
        out.append(finding("error", "d2t_missing", f"reduced draft vocab (Vd={vd} < V={v}) without d2t: vLLM maps draft ids as identity and drafts wrong tokens"))
    if e3 and vd == v and s.d2t_shape is not None:
        out.append(finding("error", "d2t_with_full_vocab", "d2t present although Vd = V: vLLM >= 0.30 refuses to load it ('no module or parameter named draft_id_to_target_id'); drop it"))
    return out


def fc_norm_checks(s: WeightSizes, flat: dict[str, Any], nested: dict[str, str]) -> list[Finding]:
    """fc_norm weights against the top-level fc_norm flag (and its SGLang alias / nested copies)."""
    out: list[Finding] = []
    fc_norm_cfg = cfg_flag(flat, "fc_norm")
    if fc_norm_cfg is None and cfg_flag(flat, "use_aux_norm") is not None:
        fc_norm_cfg = cfg_flag(flat, "use_aux_norm")
        out.append(finding("warning", "fc_norm_alias", "config uses the SGLang alias use_aux_norm; vLLM reads only fc_norm"))
    if s.fc_norm_widths:
        if s.fc_norm_widths != list(range(s.num_aux)):
            out.append(finding("error", "fc_norm_weights_incomplete", f"fc_norm weights {s.fc_norm_widths} do not cover the K={s.num_aux} aux chunks; vLLM silently uses ones for the missing ones"))
        if not fc_norm_cfg:
            where_flag = nested.get("fc_norm")
            out.append(finding("error", "fc_norm_flag_missing", "fc_norm.* weights present but the config does not set fc_norm: true at the top level"
                               + (f" (it is only in {where_flag})" if where_flag else "") + ": vLLM refuses to load ('no module or parameter named fc_norm')"))
    elif fc_norm_cfg:
        out.append(finding("error", "fc_norm_weights_missing", "config sets fc_norm: true but there are no fc_norm.* weights: vLLM silently loads all-ones norms"))
    elif nested.get("fc_norm"):
        out.append(finding("error", "flag_nested_only", f"fc_norm is set only in {nested['fc_norm']}; vLLM reads it at the top level only and ignores it"))
    return out


def input_norm_checks(s: WeightSizes, flat: dict[str, Any], nested: dict[str, str]) -> list[Finding]:
    """input_norm weights against norm_before_fc (top level or nested)."""
    out: list[Finding] = []
    nbf_cfg = cfg_flag(flat, "norm_before_fc")
    if s.input_norm is not None:
        if not nbf_cfg:
            out.append(finding("error", "norm_before_fc_flag_missing", "input_norm.weight present but norm_before_fc is not set: vLLM silently drops input_norm"))
    elif nbf_cfg:
        out.append(finding("error", "input_norm_missing", "norm_before_fc: true but no input_norm.weight: vLLM silently uses an all-ones norm"))
    if nested.get("norm_before_fc"):
        out.append(finding("warning", "norm_before_fc_nested", "norm_before_fc is only inside eagle_config: vLLM reads it there, SGLang and older tools read the top level (vllm PR #42143, sglang#32334)"))
    return out


def norm_output_checks(flat: dict[str, Any], nested: dict[str, str], producer: str) -> list[Finding]:
    """norm_output: carried by no weight, so only the config (and the producer's semantics) can be checked."""
    out: list[Finding] = []
    no_cfg = cfg_flag(flat, "norm_output")
    if no_cfg is None and nested.get("norm_output"):
        out.append(finding("error", "flag_nested_only", f"norm_output is set only in {nested['norm_output']}; vLLM reads it at the top level only and ignores it"))
    if no_cfg:
        out.append(finding("info", "norm_output_unverifiable", "norm_output: true is carried by no weight: it must match how the drafter was trained (post-norm state fed back)"))
        if producer == "specforge":
            out.append(finding("warning", "specforge_norm_output_semantics", "SpecForge before PR #879 trained with the pre-norm state fed back even with norm_output: true; vLLM feeds the post-norm state. Check the SpecForge version, or validate the acceptance length"))
    return out


def aux_id_checks(s: WeightSizes, view: Any, producer: str) -> tuple[Any, list[int] | None, list[Finding]]:
    """The stored aux ids and their convention (separate facts, eagle_migrate.aux_ids): the AuxIds reading, the ids
    DrafterConfig carries (None while they are missing or wrong), and their findings."""
    from .. import aux_ids as _aux

    aux = _aux.from_stored(view.aux_ids, view.aux_ids_source, fingerprint=view.aux_fingerprint, notes=view.aux_notes,
                           producer=view.aux_producer)
    out: list[Finding] = []
    aux_ids: list[int] | None = None
    if s.generation != "eagle3":
        return aux, aux_ids, out
    if view.aux_ids is None:
        out.append(finding("warning", "aux_ids_missing", "no eagle_aux_hidden_state_layer_ids: vLLM silently falls back to (2, T//2, T-3); the ids the drafter was trained on must be written explicitly"))
        return aux, aux_ids, out
    # the decided reading, or while undecided the literal one (what vLLM does with this checkpoint)
    ids = aux.ids if aux.decided else list(view.aux_ids)
    problems = _aux.check_aux_ids_alone(ids, s.num_aux)  # the target's part: inspect's pairing
    out.extend(problems)
    if not any(f.severity == "error" for f in problems):
        aux_ids = sorted(ids)
    out.extend(_aux.findings(aux, producer))
    if view.aux_ids_source == "eagle_config":
        out.append(finding("warning", "aux_ids_nested_only", "aux ids only in eagle_config: vLLM's GPU Model Runner V2 (default from 0.29) reads only top-level ids and silently falls back to defaults"))
    return aux, aux_ids, out


def structure_checks(s: WeightSizes, flat: dict[str, Any], scan: Any, strict_layers_check: bool) -> list[Finding]:
    """rope_theta, layer count, embed_tokens, name prefix, tied embeddings, dropped tensors."""
    out: list[Finding] = []
    e3 = s.generation == "eagle3"
    if flat and "rope_theta" not in flat and not isinstance(flat.get("rope_parameters"), dict) and e3:
        out.append(finding("info", "rope_theta_missing", "config has no rope_theta: 10000 assumed (SpecForge#265); copy the target's"))
    nhl = cfg_int(flat, "num_hidden_layers")
    if nhl is not None and nhl != s.num_layers and strict_layers_check:
        out.append(finding("error", "num_hidden_layers_mismatch", f"config num_hidden_layers={nhl} but the weights hold {s.num_layers} decoder layer(s): vLLM would build {nhl} layers and leave the extra ones random"))
    if s.hidden_size != s.target_hidden_size and e3 and s.embed_shape is None:
        out.append(finding("error", "embed_tokens_missing", f"H={s.hidden_size} differs from Ht={s.target_hidden_size} but there is no embed_tokens.weight: vLLM fails (KeyError 'embed_tokens.weight', vllm#18906)"))
    if scan.prefix:
        out.append(finding("error", "model_prefix", "tensor names carry a 'model.' prefix: vLLM fails ('no module or parameter named model'); convert to strip it"))
    if flat.get("tie_word_embeddings") is True and e3:
        out.append(finding("warning", "tie_word_embeddings", "tie_word_embeddings: true; EAGLE-3 drafters need an untied lm_head"))
    if scan.ignored:
        out.append(finding("info", "ignored_tensors", f"dropped training-only tensors: {', '.join(scan.ignored)}"))
    return out


def mla_checks(s: WeightSizes, flat: dict[str, Any], aux_ids: list[int] | None, scaling: Any) -> list[Finding]:
    """What vLLM's Eagle3DeepseekV2ForCausalLM does with an MLA drafter that a Llama one would not hit
    (vllm-contract.md section 13, deepseek_eagle3.py)."""
    out: list[Finding] = []
    if not s.mla:
        return out
    sizes = s.mla_sizes
    if sizes.get("q_lora_rank") is None:
        out.append(finding("error", "mla_q_lora_missing", "an MLA drafter without q_a_proj (q_lora_rank unset): vLLM's Eagle3 DeepSeek loader fails ('no module or parameter named layers.0.self_attn.fused_qkv_a_proj'); it cannot be served"))
    elif flat and cfg_int(flat, "q_lora_rank") is None:
        out.append(finding("error", "mla_q_lora_rank_missing", f"q_a_proj weights but no q_lora_rank in the config: vLLM builds a plain q_proj and fails to load them; convert writes q_lora_rank={sizes['q_lora_rank']}"))
    if flat.get("model_type") == "deepseek_v3":
        out.append(finding("error", "mla_model_type_deepseek_v3", "model_type deepseek_v3 on the drafter: vLLM rewrites it to its MTP model and refuses it (Eagle3DeepSeekMTPModel not supported); the drafter must say deepseek_v2 (convert writes that)"))
    if aux_ids is not None and 0 in aux_ids:
        out.append(finding("error", "mla_aux_id_zero", f"aux layer ids {aux_ids} include 0: vLLM's DeepSeek target crashes collecting it ('unsupported operand type(s) for +: Tensor and NoneType')"))
    if (sizes.get("kv_lora_rank") or 0) + (sizes.get("qk_rope_head_dim") or 0) != CPU_MLA_WIDTH:
        out.append(finding("info", "mla_cpu_head_size", f"kv_lora_rank + qk_rope_head_dim = {sizes.get('kv_lora_rank')} + {sizes.get('qk_rope_head_dim')} != {CPU_MLA_WIDTH}: vLLM's CPU MLA backend cannot run it (GPU backends can)"))
    if s.lm_head_shape is None and cfg_int(flat, "draft_vocab_size") is not None:
        out.append(finding("error", "mla_draft_vocab_without_lm_head", f"draft_vocab_size={s.draft_vocab_size} but no lm_head.weight: the drafter serves a randomly initialised head (sglang#27908)"))
    if scaling:
        try:
            mla_rope_type_of(rope_parameters_of(scaling, 1.0, cfg_int(flat, "max_position_embeddings") or 2048))
        except ValueError as e:
            out.append(finding("error", "mla_rope_scaling_unsupported", f"{e}; convert and validate refuse it"))
    if cfg_flag(flat, "norm_before_fc") or s.input_norm is not None:
        out.append(finding("error", "mla_norm_before_fc", "norm_before_fc / input_norm in an MLA drafter: vLLM's DeepSeek EAGLE-3 drafter has no input_norm; it ignores the flag (and refuses an input_norm.weight)"))
    if flat.get("attention_bias"):
        out.append(finding("warning", "mla_attention_bias", "attention_bias: true, but vLLM's MLA attention has no biases"))
    return out


def window_checks(s: WeightSizes, cv: ConfigValues) -> list[Finding]:
    """Sliding-window draft layers, as vLLM reads them for this family (carried into DrafterConfig)."""
    out: list[Finding] = []
    if cv.window_problem:
        sev = "warning" if s.family == "mla" else "error"  # MLA: our drafter does as vLLM does (no window)
        out.append(finding(sev, "sliding_window", f"layer_types / sliding_window not applied: {cv.window_problem}"))
    elif cv.sliding_window is not None:
        window = cv.sliding_window
        layers = [i for i, t in enumerate(cv.layer_types) if t == "sliding_attention"]
        if len(layers) < s.num_layers:  # llm_base_proposer.validate_same_kv_cache_group
            out.append(finding("error", "sliding_window", f"draft layer(s) {layers} are sliding-window and the "
                               "others full attention: vLLM 0.32 refuses to load such a drafter ('All drafting "
                               "layers should belong to the same kv cache group')"))
        out.append(finding("info", "sliding_window", f"draft layer(s) {layers} use sliding-window attention of "
                           f"{window} tokens (a query sees the last {window} positions; speculators' trainer "
                           "default is 2048), as vLLM serves them: carried by eagle-migrate's drafter and "
                           "written into every layout it converts to"))
    return out
