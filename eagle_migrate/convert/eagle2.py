"""EAGLE-1/2 -> EAGLE-3.1: a warm start that needs the calibration fine-tune (mapping in docs/norm-init.md).

*init*: the statistics pass runs the source (:class:`~eagle_migrate.drafter.eagle2.Eagle2Reference`) over the
calibration records (aux-state statistics, the RMS of its output, of the hidden half of fc and of the embedding);
the mapping puts fc's hidden half in the last aux chunk (its fc_norm = the target's final norm weight), folds the
embedding half of fc into the layer-0 q/k/v columns and fc's bias into their biases, and sets flat norms from those
RMS values; the agreement compares the converted drafter's drafts with the source's on held-out records.
Imports: torch, drafter (config, eagle2), formats.aux_ids, hidden_states, loader, stats,
convert.agreement/registry/eagle3/records/result/write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..drafter.config import DrafterConfig
from ..drafter.eagle2 import Eagle2Reference
from ..formats.aux_ids import AuxIds, eagle2_aux_ids
from ..hidden_states import HiddenRecord
from ..loader import build_drafter
from ..stats import StatsAccumulator, TargetStatistics, rms_normalize
from .agreement import eagle2_runner, eagle3_runner, measure_agreement
from .registry import Converter, Initialised, Traits, register_converter
from .eagle3 import held_out_split
from .read import Job
from .records import split_stream
from .result import Eagle2Mapping, FcNormWeight, NormInit, NormOutputCompensation
from .write import OutputPlan


@dataclass
class _Pass:
    """The statistics pass over the source: target statistics, held-out records and three mean RMS values."""

    stats: TargetStatistics
    held: list[HiddenRecord]
    rho_out: float  # the source's output h
    rho_g: float  # fc's hidden half applied to the (approximated) post-norm feature
    rho_e: float  # the token embedding


@register_converter
class Eagle2Converter(Converter):
    name = "eagle2"
    traits = Traits(calibration_required=True)

    @classmethod
    def accepts(cls, cfg: DrafterConfig) -> bool:
        return cfg.generation == "eagle2" and not cfg.is_eagle31

    def aux_ids(self, job: Job) -> tuple[AuxIds | None, list[int]]:
        return None, eagle2_aux_ids(job.target.info.num_layers)

    def init(self, job: Job) -> Initialised:
        cfg, o = job.cfg, job.opts
        ht = job.target.info.hidden_size
        it, n_total, n_held = held_out_split(job, True, ht)
        src_t = {n: job.ck.tensor(n).float() for n in job.ck.canonical_names()}
        if "embed_tokens.weight" not in src_t:
            src_t["embed_tokens.weight"] = job.target.weight("embed")
        lm_head = job.target.weight("lm_head")
        w_fn = job.target.weight("norm")
        ref = Eagle2Reference(cfg, src_t, lm_head, job.device, job.dtype)
        sp = self._statistics_pass(job, ref, src_t, w_fn, it, n_total, n_held)
        new, cfg_out = self._mapping(job, src_t, w_fn, lm_head, sp)
        conv = build_drafter(cfg_out, {**new, **({} if cfg_out.has_embed_tokens else {"embed_tokens.weight": src_t["embed_tokens.weight"]})},
                             device=job.device, dtype=job.dtype, what="the converted drafter")
        o.progress("evaluate", 0, len(sp.held))
        agreement = measure_agreement(eagle2_runner(ref, job.device, job.dtype),
                                      eagle3_runner(conv, conv.combine, lambda h_pre, h_post: h_post, job.device, job.dtype),
                                      sp.held, o.num_speculative_tokens, o.max_cuts, job.device,
                                      tick=lambda i: o.progress("evaluate", i, len(sp.held)))
        return self._result(job, new, cfg_out, sp, "fc.bias" in src_t, agreement)

    def _statistics_pass(self, job: Job, ref: Eagle2Reference, src_t: dict[str, torch.Tensor], w_fn: torch.Tensor, it,
                         n_total: int, n_held: int) -> _Pass:
        cfg, dev, cdtype, progress = job.cfg, job.device, job.dtype, job.opts.progress
        h, eps, kk = cfg.hidden_size, cfg.rms_norm_eps, len(job.aux_ids)
        ht = job.target.info.hidden_size
        w_h = src_t["fc.weight"][:, h:]
        emb = src_t["embed_tokens.weight"]
        last_chunk = kk - 1
        acc = StatsAccumulator(job.aux_ids, ht, eps=eps, device=dev)
        held: list[HiddenRecord] = []
        r_out, r_g, r_e = [], [], []
        progress("statistics", 0, n_total)
        with torch.no_grad():
            for i, (is_h, rec) in enumerate(split_stream(it, n_total, n_held)):
                t = rec.input_ids.shape[0]
                last = rec.last
                if last is None:  # approximate the post-norm feature from the last aux chunk
                    last = rms_normalize(rec.aux[:, last_chunk * ht:], eps) * w_fn.to(rec.aux.device)
                rec = HiddenRecord(rec.input_ids.cpu(), rec.aux.cpu(), last.cpu())
                if is_h:
                    held.append(rec)
                else:
                    acc.update(rec.aux)
                    f = rec.last[: t - 1].to(device=dev, dtype=cdtype)
                    hout = ref.forward_step(rec.input_ids[1:].to(dev).unsqueeze(0), f.unsqueeze(0),
                                            torch.arange(t - 1, device=dev).unsqueeze(0))
                    r_out.append(torch.sqrt(hout[0, 1:].float().pow(2).mean(-1) + eps).cpu())
                    fh = rms_normalize(rec.aux[1: t - 1, last_chunk * ht:], eps) * w_fn
                    r_g.append(torch.sqrt((fh @ w_h.T).pow(2).mean(-1) + eps))
                    r_e.append(torch.sqrt(emb[rec.input_ids[2:t]].pow(2).mean(-1) + eps))
                progress("statistics", i + 1, n_total)

        def mean(x: list[torch.Tensor]) -> float:
            return float(torch.cat(x).mean()) if x else 1.0

        return _Pass(acc.statistics(), held, mean(r_out), mean(r_g), mean(r_e))

    def _mapping(self, job: Job, src_t: dict[str, torch.Tensor], w_fn: torch.Tensor, lm_head: torch.Tensor,
                 sp: _Pass) -> tuple[dict[str, torch.Tensor], DrafterConfig]:
        """The EAGLE-3.1 tensors and config from the EAGLE-2 ones: :data:`MAPPING`, row by row."""
        cfg = job.cfg
        h, kk = cfg.hidden_size, len(job.aux_ids)
        bias = src_t.get("fc.bias")
        m = _Source(cfg, src_t, w_fn, lm_head, sp, kk, job.target.info.hidden_size, src_t["fc.weight"][:, :h],
                    src_t["fc.weight"][:, h:], bias, cfg.attention_bias or bias is not None, job.ck.has("embed_tokens.weight"))
        new: dict[str, torch.Tensor] = {}
        for row in MAPPING:
            new.update(row.make(m, new))
        cfg_out = DrafterConfig(**{
            **cfg.model_dump(), **job.update, "generation": "eagle3", "target_hidden_size": m.ht, "num_aux": kk,
            "draft_vocab_size": cfg.vocab_size, "fc_norm": True, "norm_output": True, "norm_before_fc": False,
            "norm_before_residual": False, "fc_bias": False, "has_lm_head": True, "has_embed_tokens": m.own_embed,
            "attention_bias": m.attn_bias,
        })
        return new, cfg_out

    def _result(self, job: Job, new: dict[str, torch.Tensor], cfg_out: DrafterConfig, sp: _Pass, had_bias: bool,
                agreement) -> Initialised:
        ids, kk = job.aux_ids, len(job.aux_ids)
        ht, last_chunk = job.target.info.hidden_size, kk - 1
        plan = OutputPlan(cfg_out)
        for n, t in new.items():
            plan.add(n, lambda t=t: t, tuple(t.shape))
        plan.inserted = [f"fc_norm.{i}.weight [{ht}] (layer {ids[i]})" for i in range(kk)] + [
            "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight (the target's)",
            "config fc_norm: true", "config norm_output: true"]
        plan.changes = [
            f"EAGLE-2 fc [H, 2H] -> fc [H, {kk}*Ht]: hidden half in chunk {last_chunk} (aux layer {ids[last_chunk]}, fc_norm = the target's final norm weight); other chunks zero",
            "embedding half of fc folded into the layer-0 q/k/v embedding columns (q' = [W_q W_e | W_q])",
            "fc.bias folded into q/k/v biases (its contribution to the residual is not representable)" if had_bias else "no fc.bias",
            f"norm.weight = {sp.rho_out:.6g} (flat, EAGLE-2 had no final norm), lm_head = the target's",
        ]
        notes = ["step 0 is near-exact; steps >= 1 feed the drafter's output back without fc (EAGLE-3 structure), which EAGLE-2 applied fc to: calibration required",
                 "the token embedding no longer enters the residual stream directly (only through attention)"]
        e2map = Eagle2Mapping(aux_layer_ids=ids, hidden_chunk=last_chunk, embedding_rms=sp.rho_e, fc_output_rms=sp.rho_g,
                              output_rms=sp.rho_out, fc_bias="folded into q/k/v biases" if had_bias else "none", notes=notes)
        fcn = [FcNormWeight(layer_id=ids[i], chunk=i, mean=float(new[f"fc_norm.{i}.weight"].mean()),
                            min=float(new[f"fc_norm.{i}.weight"].min()), max=float(new[f"fc_norm.{i}.weight"].max())) for i in range(kk)]
        norm_init = NormInit(method="eagle2-mapping", statistics=sp.stats, fc_norm=fcn,
                             notes={"chunk": f"chunk {last_chunk}: target final norm weight; others: mean RMS of their layer (their fc columns are zero)"})
        comp = NormOutputCompensation(applied=True, method="fold-rms", scale=sp.rho_out, h_pre_rms_mean=sp.rho_out, norm_before_residual=False,
                                      exact="logits' argmax exact; the fed-back state is h * R / rms(h)")
        return Initialised(plan, norm_init=norm_init, norm_output=comp, agreement=agreement, statistics=sp.stats,
                           eagle2_mapping=e2map)


# ----- the mapping, one row per EAGLE-3.1 part (docs/norm-init.md section 3 shows these rows, checked by a test) -----
@dataclass(frozen=True)
class _Source:
    """What the mapping reads: the EAGLE-2 tensors (``w_e`` / ``w_h``: fc's embedding and hidden halves, ``bias``:
    fc.bias), the target's final norm weight and head, the statistics pass, and the output's shape."""

    cfg: DrafterConfig
    t: dict[str, torch.Tensor]
    w_fn: torch.Tensor
    lm_head: torch.Tensor
    sp: _Pass
    kk: int
    ht: int
    w_e: torch.Tensor
    w_h: torch.Tensor
    bias: torch.Tensor | None
    attn_bias: bool
    own_embed: bool

    @property
    def last(self) -> int:
        return self.kk - 1


Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Row:
    """One part of the EAGLE-3.1 drafter: where it comes from and why (the docs' table), and the tensors it makes from
    the source (``done``: the rows before it; a later row's tensor replaces an earlier one's of the same name)."""

    part: str
    source: str
    why: str
    make: Callable[[_Source, Tensors], Tensors]


def _fc(m: _Source, done: Tensors) -> Tensors:
    fc = torch.zeros(m.cfg.hidden_size, m.kk * m.ht)
    fc[:, m.last * m.ht:] = m.w_h
    return {"fc.weight": fc}


def _qkv(m: _Source, done: Tensors) -> Tensors:
    return {f"layers.0.self_attn.{x}_proj.weight": torch.cat([w @ m.w_e, w], dim=1)
            for x in "qkv" for w in [m.t[f"layers.0.self_attn.{x}_proj.weight"]]}


def _rest(m: _Source, done: Tensors) -> Tensors:
    layer0_qkv = tuple(f"layers.0.self_attn.{x}_proj" for x in "qkv")
    return {n: t for n, t in m.t.items() if n.startswith("layers.") and n not in done and not n.startswith(layer0_qkv)}


def _biases(m: _Source, done: Tensors) -> Tensors:
    if not m.attn_bias:
        return {}
    out: Tensors = {}
    for x in "qkv":
        w = m.t[f"layers.0.self_attn.{x}_proj.weight"]
        b = m.t.get(f"layers.0.self_attn.{x}_proj.bias", torch.zeros(w.shape[0]))
        out[f"layers.0.self_attn.{x}_proj.bias"] = b + (w @ m.bias if m.bias is not None else 0)
    for i in range(m.cfg.num_layers):
        for x in "qkv":
            nm = f"layers.{i}.self_attn.{x}_proj.bias"
            if nm not in done and nm not in out:
                out[nm] = torch.zeros(m.t[f"layers.{i}.self_attn.{x}_proj.weight"].shape[0])
        out[f"layers.{i}.self_attn.o_proj.bias"] = torch.zeros(m.cfg.hidden_size)  # vLLM builds o_proj with a bias too
    return out


MAPPING: tuple[Row, ...] = (
    Row("`fc` `[H, K·Ht]`", "chunk K−1 = `W_h`, other chunks 0", "`fc_norm_{K−1}(h_{L−1}) ≈ norm(h_L) = f`", _fc),
    Row("`fc_norm.{K−1}`", "the target's final norm weight", "reproduces `f = w_fn ⊙ h / rms(h)`",
        lambda m, done: {f"fc_norm.{m.last}.weight": m.w_fn.clone()}),
    Row("`fc_norm.{k<K−1}`", "mean RMS of layer k", "their fc columns are zero; a sensible start for calibration",
        lambda m, done: {f"fc_norm.{i}.weight": torch.full((m.ht,), m.sp.stats.layers[i].rms_mean) for i in range(m.last)}),
    Row("layer-0 `q/k/v` `[·, 2H]`", "`[W_q W_e | W_q]`", "attention of EAGLE-2 saw `W_q (W_e e + W_h f)`", _qkv),
    Row("`input_layernorm`, `hidden_norm`", "`ρ_e · 1`, `ρ_g · 1` (mean RMS of `e`, of `W_h f`)",
        "the norms return `≈ e`, `≈ g`",
        lambda m, done: {"layers.0.input_layernorm.weight": torch.full((m.cfg.hidden_size,), m.sp.rho_e),
                         "layers.0.hidden_norm.weight": torch.full((m.cfg.hidden_size,), m.sp.rho_g)}),
    Row("`norm`, `lm_head`", "`R · 1` (mean RMS of EAGLE-2's output), the target's head",
        "logits `= lm_head(h) · R / r`: same argmax",
        lambda m, done: {"norm.weight": torch.full((m.cfg.hidden_size,), m.sp.rho_out), "lm_head.weight": m.lm_head}),
    Row("every other `layers.*` tensor", "the source's, as it is", "the decoder layer is the same", _rest),
    Row("`fc.bias` `b`", "folded into q/k/v biases `W_{q,k,v} b` (`attention_bias: true`, zero `o_proj.bias`)",
        "vLLM builds `o_proj` with a bias whenever `attention_bias` is set", _biases),
    Row("`embed_tokens`", "the source's own, when it has one (else the target's, from vLLM)",
        "EAGLE-2 drafters share the target's embedding unless trained with their own",
        lambda m, done: {"embed_tokens.weight": m.t["embed_tokens.weight"]} if m.own_embed else {}),
)
