"""Whether a drafter and a target work together: the one home of the pairing rules. ``inspect`` reports them as
findings (:func:`pairing_findings`), ``convert`` refuses a pair that breaks one (:func:`check_pairing`,
PairingError, exit 2); both read the same size rules (:func:`size_mismatches`). Reads the target's config
(:class:`TargetInfo`, defined here: ``target.target_info`` reads it, inspect's report shows it) only, never its
weights, and imports no torch.
Imports: ``errors``, ``families``, ``drafter.config``, ``formats.base`` / ``traps`` / ``aux_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import families
from .drafter.config import DrafterConfig
from .errors import PairingError
from .formats import aux_ids as _aux
from .formats.traps import finding

if TYPE_CHECKING:  # pragma: no cover
    from .formats.base import Checkpoint, Finding


@dataclass(frozen=True)
class TargetInfo:
    """What the pairing checks need, read from config.json alone (``target.target_info``). The one definition of
    these fields: inspect's report shows them less ``rms_norm_eps`` and ``raw`` (``inspection.TargetSummary``)."""

    path: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_position_embeddings: int | None
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rms_norm_eps: float
    model_type: str
    raw: dict[str, Any]


@dataclass(frozen=True)
class Mismatch:
    """One size rule the pair breaks: its trap code, the inspect finding's message, convert's refusal."""

    code: str
    report: str
    refusal: str


def size_mismatches(cfg: DrafterConfig, t: TargetInfo, vocab_size: int | None = None) -> list[Mismatch]:
    """The sizes vLLM needs equal, in report order: the target hidden size fc reads (H for EAGLE-2, Ht for EAGLE-3),
    the vocabulary (``vocab_size``: the drafter's V as declared, default ``cfg.vocab_size``), Vd within V."""
    v = cfg.vocab_size if vocab_size is None else vocab_size
    out: list[Mismatch] = []
    need_ht = cfg.hidden_size if cfg.generation == "eagle2" else cfg.target_hidden_size
    if need_ht != t.hidden_size:
        if cfg.generation == "eagle2":
            refusal = (f"hidden size mismatch: the EAGLE-2 drafter's fc reads the target's last hidden state of size "
                       f"H={cfg.hidden_size}, but the target {t.path} has hidden_size={t.hidden_size}")
        else:
            refusal = (f"target hidden size mismatch: the drafter expects Ht={cfg.target_hidden_size} (fc takes K*Ht = "
                       f"{cfg.num_aux}*{cfg.target_hidden_size} = {cfg.num_aux * cfg.target_hidden_size}) but the target "
                       f"{t.path} has hidden_size={t.hidden_size}")
        out.append(Mismatch("target_hidden_size_mismatch",
                            f"the drafter expects target hidden size {need_ht}, the target has {t.hidden_size}", refusal))
    if v != t.vocab_size:
        out.append(Mismatch("vocab_size_mismatch_target",
                            f"the drafter's vocab V={v}, the target's {t.vocab_size}: vLLM requires them equal",
                            f"vocabulary mismatch: the drafter has vocab_size={v} but the target {t.path} has "
                            f"vocab_size={t.vocab_size}"))
    if cfg.draft_vocab_size > t.vocab_size:
        out.append(Mismatch("draft_vocab_exceeds_vocab",
                            f"draft vocab Vd={cfg.draft_vocab_size} > target vocab {t.vocab_size}",
                            f"vocabulary mismatch: draft_vocab_size={cfg.draft_vocab_size} exceeds the target's "
                            f"vocab_size={t.vocab_size}"))
    return out


def check_pairing(cfg: DrafterConfig, tinfo: TargetInfo, aux_ids: list[int] | None) -> None:
    """Raise PairingError (exit 2) when drafter and target cannot work together; the message names both numbers.
    ``aux_ids`` (vLLM convention; None = not yet known) go through :func:`eagle_migrate.formats.aux_ids.check_aux_ids`."""
    for m in size_mismatches(cfg, tinfo):
        raise PairingError(m.refusal)
    if cfg.generation == "eagle3" and aux_ids is not None:
        err = _aux.pairing_error(aux_ids, cfg.num_aux, tinfo.num_layers)
        if err:
            raise PairingError(err + " (vLLM convention)")


def target_family_note(architecture: str, target_model_type: str | None) -> str | None:
    """A note when a drafter of a target-specific family (``Family.target_note``: what is specific, the target
    model_type prefixes it is built for) is paired with a target of another family (``model_type``), None
    otherwise. Llama-layer drafters are the generic EAGLE-3 layer, trained for targets of every family
    (speculators, SpecForge): no note for them."""
    family = families.find(architecture)
    note = family.target_note if family is not None else None
    mt = (target_model_type or "").lower()
    if note is None or not mt or mt.startswith(note[1]):
        return None
    what, prefixes = note
    return (f"a {architecture} drafter ({what}, built for {' / '.join(p.capitalize() for p in prefixes)} targets) on "
            f"a target of model_type {mt!r}: the sizes fit, but a drafter trained on another model's hidden states "
            "rarely has a draft accepted; check that it was made for this target (validate measures it)")


def pairing_findings(ck: Checkpoint, ti: TargetInfo) -> list[Finding]:
    """The pairing of a read checkpoint with a target's config, as inspect reports it (errors, warnings, info)."""
    cfg = ck.config
    out: list[Finding] = []
    t_layers = ti.num_layers
    v_declared = ck.meta.get("vocab_size_declared", cfg.vocab_size)
    out += [finding("error", m.code, m.report) for m in size_mismatches(cfg, ti, v_declared)]
    if cfg.generation == "eagle3":
        # the reader judged d2t against the drafter's own V; only a target whose V differs can change the verdict
        if cfg.draft_vocab_size == ti.vocab_size != v_declared and ck.has("d2t"):
            out.append(finding("error", "d2t_with_full_vocab", "d2t present although Vd equals the target vocab: vLLM >= 0.30 refuses to load it"))
        if cfg.draft_vocab_size == v_declared != ti.vocab_size and not ck.has("d2t"):
            out.append(finding("error", "d2t_missing", f"Vd={cfg.draft_vocab_size} differs from the target vocab {ti.vocab_size} but there is no d2t"))
        ids = cfg.aux_layer_ids
        a = ck.aux
        if ids is None and a is not None and a.stored is not None:  # ids that failed the reader's check: report them
            ids = a.ids if a.decided else list(a.stored)
        out += _aux.check_aux_ids_on_target(ids, cfg.num_aux, t_layers)  # the rest: the reader's check_aux_ids_alone
    if ti.max_position_embeddings and cfg.max_position_embeddings < int(ti.max_position_embeddings):
        out.append(finding("warning", "max_position_embeddings_low", f"drafter max_position_embeddings={cfg.max_position_embeddings} < the target's {ti.max_position_embeddings}: vLLM < 0.27 crashes past it (vllm#48894), later versions raise it silently"))
    if abs(cfg.rope_theta - ti.rope_theta) > 1e-6 * max(1.0, ti.rope_theta):
        out.append(finding("warning", "rope_theta_mismatch", f"drafter rope_theta={cfg.rope_theta:g}, target {ti.rope_theta:g}: fine only if the drafter was trained that way (a missing rope_theta defaults to 10000, SpecForge#265)"))
    if _norm_scaling(cfg.rope_scaling) != _norm_scaling(ti.rope_scaling):
        out.append(finding("warning", "rope_scaling_mismatch", f"drafter rope_scaling={cfg.rope_scaling}, target {ti.rope_scaling} (dropped rope_scaling: speculators#574)"))
    if cfg.generation == "eagle3" and (note := target_family_note(cfg.architecture, ti.model_type)):
        out.append(finding("warning", "drafter_family_differs", note))
    if abs(cfg.rms_norm_eps - ti.rms_norm_eps) > 1e-12 and ck.raw_config:
        out.append(finding("info", "rms_norm_eps_differs", f"drafter rms_norm_eps={cfg.rms_norm_eps:g}, target {ti.rms_norm_eps:g}"))
    return out


def _norm_scaling(s: dict[str, Any] | None) -> dict[str, Any] | None:
    if not s:
        return None
    d = dict(s)
    if "type" in d and "rope_type" not in d:
        d["rope_type"] = d.pop("type")
    d.pop("type", None)
    d.pop("rope_theta", None)
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in sorted(d.items())}
