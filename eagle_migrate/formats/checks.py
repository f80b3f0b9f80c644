"""The traps ``derive`` finds in a drafter checkpoint, one small check per topic, in the order they are reported.

Each check reads the derived :class:`~eagle_migrate.formats.sizes.WeightSizes` (what the weights say) and the config, and
returns findings made by :func:`~eagle_migrate.formats.traps.finding` (the one table of codes and severities). The
family's own checks are its module's (``Family.head_checks``, ``Family.vllm_checks``; eagle_migrate/families/).
"""

from __future__ import annotations

from typing import Any

from .. import families
from . import aux_ids as _aux
from .base import Finding
from .sizes import ConfigValues, WeightSizes, cfg_flag, cfg_int
from .traps import finding


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
    """config head sizes against the weights, and the family's traps about them (``Family.head_checks``)."""
    return families.get(s.family).head_checks(s, flat, finding)


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
    """The stored aux ids and their convention (separate facts, formats/aux_ids.py): the AuxIds reading, the ids
    DrafterConfig carries (None while they are missing or wrong), and their findings."""
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


def family_checks(s: WeightSizes, flat: dict[str, Any], aux_ids: list[int] | None, scaling: Any) -> list[Finding]:
    """What vLLM's drafter class of this family does with the checkpoint that another family's would not
    (``Family.vllm_checks``; ``scaling``: the config's rope_scaling)."""
    return families.get(s.family).vllm_checks(s, flat, aux_ids, scaling, finding)


def window_checks(s: WeightSizes, cv: ConfigValues) -> list[Finding]:
    """Sliding-window draft layers, as vLLM reads them for this family (carried into DrafterConfig)."""
    out: list[Finding] = []
    if cv.window_problem:
        # a family without windows: our drafter does as vLLM does (no window)
        sev = "warning" if families.get(s.family).window_ignored else "error"
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
