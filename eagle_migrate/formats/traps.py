"""Every trap ``inspect`` (and the readers behind it) reports: one table, the one home of each code's severity and
meaning. docs/formats.md shows the same table (tests/unit/test_layers.py checks that the two agree).

:func:`finding` is the one way to make a :class:`~eagle_migrate.formats.base.Finding`: a code that is not in the table,
or a severity the table does not allow for it, is a programming error (ValueError), so no trap exists outside it.
The message carries the case's numbers; the severity is the table's (``also``: the other severities a code takes,
chosen where it is emitted, e.g. ``no_lm_head`` is an error only when Vd != V).

A drafter family's own traps (emitted by its module's checks) are its rows: ``Family.traps``, appended to the table
in registry order (eagle_migrate/families/), so a family and its codes live in one module.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import families
from .base import Finding, Severity


@dataclass(frozen=True)
class Trap:
    code: str
    severity: Severity
    meaning: str
    also: tuple[Severity, ...] = ()

    @property
    def severities(self) -> tuple[Severity, ...]:
        return (self.severity, *self.also)


TRAPS: dict[str, Trap] = {t.code: t for t in (
    Trap('hidden_size_mismatch', 'error', 'config `hidden_size` contradicts the weights'),
    Trap('num_heads_mismatch', 'error', 'config heads contradict q/k widths'),
    Trap('num_kv_heads_mismatch', 'error', 'config heads contradict q/k widths'),
    Trap('head_dim_mismatch', 'error', 'config heads contradict q/k widths'),
    Trap('num_hidden_layers_mismatch', 'error', "config `num_hidden_layers` != decoder layers in the weights (vLLM builds the config's count, extras random)"),
    Trap('vocab_size_mismatch', 'error', 'config vocab sizes contradict `t2d`/`embed_tokens`/`lm_head`'),
    Trap('draft_vocab_size_mismatch', 'error', 'config vocab sizes contradict `t2d`/`embed_tokens`/`lm_head`'),
    Trap('draft_vocab_exceeds_vocab', 'error', 'Vd > V'),
    Trap('fc_width_not_multiple', 'error', 'fc input is not a multiple of Ht'),
    Trap('target_hidden_size_missing', 'warning', 'Ht != H without `target_hidden_size` (error when `fc_norm` weights prove it)', also=('error',)),
    Trap('target_hidden_size_mismatch', 'error', "config `target_hidden_size` vs `fc_norm` width, or the drafter's Ht vs the target's hidden size"),
    Trap('embed_tokens_missing', 'error', 'H != Ht and no `embed_tokens` (vllm#18906)'),
    Trap('num_aux_missing', 'warning', 'K != 3 without `num_aux_hidden_states` (vLLM sizes fc for 3)'),
    Trap('no_lm_head', 'warning', "no `lm_head`: the target's head is shared (error when Vd != V)", also=('error',)),
    Trap('d2t_missing', 'error', 'Vd != V without `d2t` (identity mapping: wrong tokens)'),
    Trap('d2t_with_full_vocab', 'error', '`d2t` present with Vd = V: vLLM >= 0.30 refuses to load'),
    Trap('d2t_out_of_range', 'error', '`arange(Vd) + d2t` outside [0, V), not strictly increasing, or not integers'),
    Trap('d2t_not_monotonic', 'error', '`arange(Vd) + d2t` outside [0, V), not strictly increasing, or not integers'),
    Trap('d2t_dtype', 'error', '`arange(Vd) + d2t` outside [0, V), not strictly increasing, or not integers'),
    Trap('t2d_shape', 'warning', '`t2d` disagrees with V / Vd / `d2t` (vLLM ignores `t2d`)'),
    Trap('t2d_inconsistent', 'warning', '`t2d` disagrees with V / Vd / `d2t` (vLLM ignores `t2d`)'),
    Trap('fc_norm_weights_missing', 'error', '`fc_norm: true` without weights: vLLM silently uses ones'),
    Trap('fc_norm_weights_incomplete', 'error', 'fewer `fc_norm.{k}` than K'),
    Trap('fc_norm_flag_missing', 'error', '`fc_norm.*` weights without the top-level flag: vLLM load error'),
    Trap('fc_norm_alias', 'warning', "SGLang's `use_aux_norm` instead of `fc_norm`"),
    Trap('fc_norm_all_ones', 'info', 'every `fc_norm` weight is exactly 1 (uncalibrated conversion?)'),
    Trap('norm_before_fc_flag_missing', 'error', '`input_norm.weight` without `norm_before_fc`: vLLM drops it silently'),
    Trap('input_norm_missing', 'error', '`norm_before_fc: true` without `input_norm.weight`: ones'),
    Trap('norm_before_fc_nested', 'warning', '`norm_before_fc` only in `eagle_config` (vLLM reads it, SGLang/older tools do not)'),
    Trap('flag_nested_only', 'error', '`fc_norm`/`norm_output`/`norm_before_residual` only in `eagle_config` / `transformer_layer_config`: ignored by vLLM'),
    Trap('norm_output_unverifiable', 'info', '`norm_output: true` has no weight to confirm it'),
    Trap('specforge_norm_output_semantics', 'warning', 'SpecForge before PR #879 trained `norm_output` drafters pre-norm'),
    Trap('norm_before_residual_implicit', 'warning', 'speculators config without `norm_before_residual`: vLLM assumes true'),
    Trap('speculators_31_flags_version', 'info', '3.1 flags in the speculators format need vLLM >= 0.25'),
    Trap('sliding_window', 'info', "`layer_types` makes draft layers sliding-window (speculators' trainer default, 2048): read as vLLM reads it per family, carried by our drafter and written by every writer (warning: " + "; ".join(f.window_trap_note for f in families.all_families() if f.window_trap_note) + "; error: a window vLLM cannot apply as given, e.g. `layer_types` shorter than the layers, or full and sliding layers mixed, which vLLM refuses to load)", also=('warning', 'error')),
    Trap('specforge_norm_output_false', 'warning', '`norm_output: false` in a SpecForge export: SpecForge 0.2.0 then trains `lm_head` without the final norm, vLLM always applies it'),
    Trap('speculators_config_invalid', 'error', "what vLLM's speculators parser requires is missing"),
    Trap('aux_ids_missing', 'warning', 'no aux ids: vLLM falls back to (2, T//2, T-3)'),
    Trap('aux_ids_nested_only', 'warning', 'ids only in `eagle_config`: Model Runner V2 (GPU default from 0.29) ignores them'),
    Trap('aux_ids_count_mismatch', 'error', 'id list length != K, or a repeated layer'),
    Trap('aux_ids_duplicate', 'error', 'id list length != K, or a repeated layer'),
    Trap('aux_ids_out_of_range', 'error', 'ids outside 0..T for the target (or negative): vLLM never captures them'),
    Trap('aux_id_last_layer', 'warning', 'id T: pre-norm in vLLM, post-norm in transformers'),
    Trap('aux_ids_default', 'info', 'what vLLM will use without ids for this target; invalid when not K distinct layers'),
    Trap('aux_ids_default_invalid', 'error', 'what vLLM will use without ids for this target; invalid when not K distinct layers'),
    Trap('aux_ids_convention', 'info', 'the convention was decided (fingerprint, override or validity on the target); warning when a fingerprint says output-of-layer (served as is, vLLM reads them one layer off)', also=('warning',)),
    Trap('aux_ids_convention_ambiguous', 'warning', 'stored ids that can be read two ways and nothing decides (no target, or a target without weights)'),
    Trap('aux_ids_measured', 'info', 'decided by measurement: both readings\' statistics, the paired difference and its SE'),
    Trap('aux_ids_equivalent', 'warning', "both readings serve the same on the target (measured): a known producer's training convention is written (taken from the producer, not measured), else the stored ids are kept as they are"),
    Trap('aux_evidence_none', 'warning', 'measured on the target, but the drafter drafts under no reading (agreement ~0, no better than a uniform guess, at the floor, or a zero SE): decides nothing; the stored values are read as vLLM reads them'),
    Trap('norm_before_residual_measured', 'info', 'norm_before_residual not in the config: decided by measurement on the target (warning: the measurement was no evidence)', also=('warning',)),
    Trap('aux_ids_unsorted', 'info', 'ids not ascending (vLLM concatenates ascending)'),
    Trap('vocab_size_mismatch_target', 'error', "the drafter's V != the target's vocab"),
    Trap('rope_theta_mismatch', 'warning', "drafter rope differs from the target's"),
    Trap('rope_scaling_mismatch', 'warning', "drafter rope differs from the target's"),
    Trap('rope_theta_missing', 'info', 'no rope in the config: 10000 assumed'),
    Trap('rms_norm_eps_differs', 'info', 'drafter and target eps differ'),
    Trap('drafter_family_differs', 'warning', f"a {' / '.join(f.title for f in families.all_families() if f.target_note)} drafter on a target of another family (the sizes fit; it was probably made for another model)"),
    Trap('max_position_embeddings_low', 'warning', "drafter max positions < the target's (vLLM < 0.27 crashes)"),
    Trap('model_prefix', 'error', 'names carry `model.`: vLLM cannot load them'),
    Trap('tie_word_embeddings', 'warning', 'tied head in an EAGLE-3 drafter'),
    Trap('nonfinite_weights', 'error', 'NaN/Inf in a checked tensor'),
    Trap('nonfinite_check_partial', 'info', 'only norms and small tensors were checked (no `--deep`)'),
    Trap('eagle2_generation', 'info', 'EAGLE-1/2 weights (convert to serve in vLLM)'),
    Trap('fc_bias_mismatch', 'warning', 'EAGLE-1 config `bias` contradicts `fc.bias` presence'),
    Trap('config_missing', 'warning', 'no config.json (SafeAILab trainer output)'),
    Trap('head_dim_guessed', 'info', 'heads inferred from widths alone'),
    Trap('ignored_tensors', 'info', 'training-only tensors dropped (`verifier_lm_head`, `verifier_norm`)'),
    *(Trap(code, severity, meaning, also) for code, severity, meaning, also in families.trap_rows()),
)}


def finding(severity: Severity, code: str, message: str) -> Finding:
    """The finding ``code`` (a row of :data:`TRAPS`) with this case's message."""
    trap = TRAPS.get(code)
    if trap is None:
        raise ValueError(f"internal: trap code {code!r} is not in formats/traps.py TRAPS")
    if severity not in trap.severities:
        raise ValueError(f"internal: trap {code!r} is {'/'.join(trap.severities)}, not {severity}")
    return Finding(severity=severity, code=code, message=message)
