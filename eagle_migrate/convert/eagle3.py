"""EAGLE-3 -> EAGLE-3.1: ``fc_norm`` initialised from target statistics, ``norm_output`` compensated (docs/norm-init.md).

*init* in three parts: (1) the statistics pass streams the calibration records once through the source drafter
(aux-state statistics for the fc_norm fits, the RMS of the pre-norm output); (2) each fc_norm candidate is scored on
held-out records by step-0 agreement with the source and its fc-output error, the best kept (:func:`choose`);
(3) what is fed back under ``norm_output`` is measured by chain agreement, and the fold of a flat final norm ``R`` into
``lm_head`` is kept when it does not lose to no compensation. The output plan streams every other tensor from the
source. Imports: torch, drafter (config, model), errors, hidden_states, loader, stats,
convert.agreement/registry/records/result/write."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafter.config import DrafterConfig
from ..drafter.model import EagleDrafter
from ..errors import DataError
from ..hidden_states import HiddenRecord
from ..loader import build_drafter
from ..stats import StatsAccumulator, rms_normalize
from .agreement import AgreementCounter, chains, cuts, eagle3_runner
from .registry import Converter, Initialised, Traits, register_converter
from .read import Job
from .records import records, split_stream, stats_sequences
from .result import (
    Agreement,
    FcNormWeight,
    FeedbackVariant,
    NormCandidate,
    NormInit,
    NormOutputCompensation,
)
from .write import OutputPlan, copy_from

# among candidates within 0.002 step-0 agreement and 1 % fc error of the best, the first of these is kept
PREFERENCE = ["mean-rms", "median-rms", "lstsq-scalar", "lstsq-scalar-relative", "lstsq-channel", "lstsq-channel-relative",
              "lstsq-channel-independent", "channel-rms", "ones"]


def scale_columns(w: torch.Tensor, scale: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """``w * scale`` (per column) computed in fp32 ``rows`` rows at a time and stored in ``w``'s dtype: the largest
    tensor (an 8B-shaped lm_head, 250 MiB bf16) used to pass through a float32 copy and a float32 product (1 GiB of
    transients at once: the structural conversion's peak)."""
    s = scale.to(device=w.device, dtype=torch.float32).unsqueeze(0)
    out = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    for i in range(0, w.shape[0], rows):
        out[i : i + rows] = (w[i : i + rows].float() * s).to(w.dtype)
    return out


def held_out_split(job: Job, want_last: bool, ht: int):
    """(record iterator, total, held-out count) for the statistics pass; DataError when they cannot be split."""
    o = job.opts
    it, n_total = records(job.target, job.data, o.hidden_states_dir, job.aux_ids, ht,
                          stats_sequences(o.num_sequences, job.device), o.seed, o.max_length, want_last=want_last)
    n_held = o.held_out if o.held_out is not None else max(1, min(16, n_total // 4))
    if n_total - n_held < 1:
        raise DataError(f"{n_total} calibration sequence(s) cannot be split into statistics and held-out sets",
                        "pass more sequences (--num-sequences / --data)")
    return it, n_total, n_held


@dataclass
class _Pass:
    """The statistics pass over the source: target statistics, the held-out records, RMS of h_pre per token."""

    acc: StatsAccumulator
    held: list[HiddenRecord]
    r_pre: torch.Tensor


@register_converter
class Eagle3Converter(Converter):
    name = "eagle3"
    traits = Traits(judged_against_source=True)

    @classmethod
    def accepts(cls, cfg: DrafterConfig) -> bool:
        return cfg.generation == "eagle3" and not cfg.is_eagle31

    def init(self, job: Job) -> Initialised:
        cfg = job.cfg
        it, n_total, n_held = held_out_split(job, False, cfg.target_hidden_size)
        m, fc_fold = self._source_drafter(job)
        sp = self._statistics_pass(job, m, fc_fold, it, n_total, n_held)
        stats, fits = sp.acc.statistics(), sp.acc.fits()
        r_bar = float(sp.r_pre.mean())
        results = self._score_candidates(job, m, fc_fold, fits, sp.held)
        best = choose(results, cfg.norm_before_residual)
        for r in results:
            r.chosen = r.method == best
        chosen_w = fits.candidates[best]
        comp, agreement = self._feedback(job, m, self._g(job, fc_fold, chosen_w), sp.held, r_bar, float(sp.r_pre.median()))
        plan = self._plan(job, chosen_w, r_bar if comp.applied else None, m.norm.weight.detach().float().cpu())
        kk = cfg.num_aux
        fcn = [FcNormWeight(layer_id=job.aux_ids[i], chunk=i, mean=float(chosen_w[i].mean()), min=float(chosen_w[i].min()),
                            max=float(chosen_w[i].max())) for i in range(kk)]
        norm_init = NormInit(method=best, fc_norm=fcn, candidates=results, statistics=stats, warnings=fits.warnings,
                             notes={"selection": "highest step-0 agreement on held-out sequences; ties within 0.002 -> lowest fc error "
                                    + ("(cosine: norm_before_residual makes the scale of fc's output irrelevant)"
                                       if cfg.norm_before_residual else "(relative L2)")})
        return Initialised(plan, norm_init=norm_init, norm_output=comp, agreement=agreement, statistics=stats)

    # ----- the source drafter and the statistics pass ----------------------------------------------------------------
    def _source_drafter(self, job: Job) -> tuple[EagleDrafter, torch.Tensor]:
        """The source as an EagleDrafter (its lm_head only when agreement is measured; the target's embedding,
        memory-mapped, when it has none) and fc's weight with input_norm's weight folded in."""
        ck, cfg = job.ck, job.cfg
        skip = () if job.opts.evaluate else ("lm_head.weight",)
        src_t = {n: ck.tensor(n) for n in ck.canonical_names() if n != "t2d" and n not in skip}
        if "embed_tokens.weight" not in src_t:
            src_t["embed_tokens.weight"] = job.target.weight("embed", mapped=True)  # only looked-up rows are ever read
        src_cfg = cfg.model_copy(update={"fc_norm": False, "norm_output": False})
        m = build_drafter(src_cfg, src_t, device=job.device, dtype=job.dtype, allow_missing=skip, what=f"{ck.path}")
        del src_t
        fc_w = m.fc.weight.detach()  # the module's dtype: no float32 copy of an 8B-sized fc
        return m, (scale_columns(fc_w, m.input_norm.weight.detach()) if cfg.norm_before_fc else fc_w)

    def _statistics_pass(self, job: Job, m: EagleDrafter, fc_fold: torch.Tensor, it, n_total: int, n_held: int) -> _Pass:
        cfg, dev, cdtype, progress = job.cfg, job.device, job.dtype, job.opts.progress
        eps = cfg.rms_norm_eps
        acc = StatsAccumulator(job.aux_ids, cfg.target_hidden_size, eps=eps, norm_before_fc=cfg.norm_before_fc,
                               fc_weight=fc_fold, device=dev)
        held: list[HiddenRecord] = []
        r_pre: list[torch.Tensor] = []
        progress("statistics", 0, n_total)
        with torch.no_grad():
            for n_done, (is_h, rec) in enumerate(split_stream(it, n_total, n_held), 1):
                if is_h:
                    held.append(HiddenRecord(rec.input_ids.cpu(), rec.aux.cpu(), None))
                else:
                    acc.update(rec.aux)
                    t = rec.input_ids.shape[0]
                    aux = rec.aux[: t - 1].to(device=dev, dtype=cdtype)
                    o = m.forward_step(rec.input_ids[1:].to(dev).unsqueeze(0), m.combine(aux).unsqueeze(0),
                                       torch.arange(t - 1, device=dev).unsqueeze(0))
                    r_pre.append(torch.sqrt(o.h_feed[0, 1:].float().pow(2).mean(-1) + eps).cpu())
                progress("statistics", n_done, n_total)
        return _Pass(acc, held, torch.cat(r_pre) if r_pre else torch.ones(1))

    # ----- (1) fc_norm candidates --------------------------------------------------------------------------------
    @staticmethod
    def _g(job: Job, fc_fold: torch.Tensor, ws: list[torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """g = fc(fc_norm(aux)) with the fc_norm weights ``ws`` (one per chunk)."""
        cfg, dev, cdtype = job.cfg, job.device, job.dtype
        kk, ht, eps = cfg.num_aux, cfg.target_hidden_size, cfg.rms_norm_eps
        wcat = torch.cat(ws).to(device=dev, dtype=cdtype)
        fcw = fc_fold.to(device=dev, dtype=cdtype)

        def g(aux: torch.Tensor) -> torch.Tensor:
            t = aux.shape[0]
            u = rms_normalize(aux.view(t, kk, ht), eps).to(cdtype).view(t, -1)
            return F.linear(u * wcat, fcw)

        return g

    def _score_candidates(self, job: Job, m: EagleDrafter, fc_fold: torch.Tensor, fits, held: list[HiddenRecord]) -> list[NormCandidate]:
        """Each candidate's step-0 agreement with the source (when evaluated) and fc-output error on ``held``."""
        dev, cdtype, k, evaluate, progress = job.device, job.dtype, job.opts.num_speculative_tokens, job.opts.evaluate, job.opts.progress
        cands = fits.candidates
        pre = _feed_pre
        src_runner = eagle3_runner(m, m.combine, pre, dev, cdtype)
        counters = {name: AgreementCounter(k) for name in cands}
        err_num = dict.fromkeys(cands, 0.0)
        err_den = dict.fromkeys(cands, 0.0)
        cos_sum = dict.fromkeys(cands, 0.0)
        cos_n = dict.fromkeys(cands, 0)
        progress("evaluate", 0, 2 * len(held))
        with torch.no_grad():
            for i, rec in enumerate(held):
                s = src_runner.prefill(rec) if evaluate else None
                t = rec.input_ids.shape[0]
                aux = rec.aux[: t - 1].to(device=dev, dtype=cdtype)
                gs = m.combine(aux)[1:].float()
                for name, ws in cands.items():
                    gfn = self._g(job, fc_fold, ws)
                    if evaluate:
                        c = eagle3_runner(m, gfn, pre, dev, cdtype).prefill(rec)
                        counters[name].add_step0(s.top1, c.top1)
                    gc = gfn(aux)[1:].float()
                    err_num[name] += float((gc - gs).pow(2).sum())
                    err_den[name] += float(gs.pow(2).sum())
                    cos_sum[name] += float(F.cosine_similarity(gc, gs, dim=-1).sum())
                    cos_n[name] += gc.shape[0]
                progress("evaluate", i + 1, 2 * len(held))
        return [NormCandidate(method=name, step0_agreement=counters[name].result(len(held)).step0,
                              fc_rel_error=err_num[name] / err_den[name] if err_den[name] else None,
                              fc_cosine=cos_sum[name] / cos_n[name] if cos_n[name] else None, note=fits.notes.get(name))
                for name in cands]

    # ----- (2) what is fed back under norm_output ------------------------------------------------------------------
    def _feedback(self, job: Job, m: EagleDrafter, gbest, held: list[HiddenRecord], r_bar: float,
                  r_median: float) -> tuple[NormOutputCompensation, Agreement]:
        cfg, dev, cdtype, o = job.cfg, job.device, job.dtype, job.opts
        k, eps = o.num_speculative_tokens, cfg.rms_norm_eps
        variants = {
            "pre-norm": ("norm_output off (EAGLE-3 feedback), for reference", _feed_pre),
            "norm_output": ("norm_output with the source's norm and lm_head unchanged", lambda h_pre, h_post: h_post),
            "norm_output+fold-rms": (f"norm_output, norm.weight = R = {r_bar:.4g} (flat), old norm weight and 1/R folded into lm_head",
                                     lambda h_pre, h_post: (rms_normalize(h_pre, eps).to(h_pre.dtype) * r_bar)),
        }
        src_runner = eagle3_runner(m, m.combine, _feed_pre, dev, cdtype)
        vcount = {n: AgreementCounter(k) for n in variants}
        final = AgreementCounter(k)
        with torch.no_grad():
            for i, rec in enumerate(held if o.evaluate else []):
                s = src_runner.prefill(rec)
                at = cuts(rec.input_ids.shape[0], o.max_cuts, k)
                src_chains = chains(src_runner, s, at, k, dev)
                c = eagle3_runner(m, gbest, _feed_pre, dev, cdtype).prefill(rec)
                final.add_step0(s.top1, c.top1)
                for vname, (_, fb) in variants.items():
                    r = eagle3_runner(m, gbest, fb, dev, cdtype)
                    vcount[vname].add_chains(src_chains, chains(r, c, at, k, dev))
                o.progress("evaluate", len(held) + i + 1, 2 * len(held))
        vres = {n: vcount[n].result(len(held)) for n in variants}
        fold_ok = _mean(vres["norm_output+fold-rms"].steps) >= _mean(vres["norm_output"].steps) - 1e-12  # True when not measured
        chosen_v = "norm_output+fold-rms" if fold_ok else "norm_output"
        comp = NormOutputCompensation(
            applied=fold_ok, method="fold-rms" if fold_ok else "none", scale=r_bar if fold_ok else None,
            h_pre_rms_mean=r_bar, h_pre_rms_median=r_median, norm_before_residual=cfg.norm_before_residual,
            exact=("exact (hidden_norm and the residual both see a normalised state)" if cfg.norm_before_residual else
                   "exact for the attention input; the residual sees h_pre * R / rms(h_pre) instead of h_pre"),
            variants=[FeedbackVariant(name=n, description=variants[n][0], step_agreement=vres[n].steps, chosen=(n == chosen_v))
                      for n in variants],
        )
        agreement = Agreement(step0=final.result(len(held)).step0, steps=vres[chosen_v].steps, num_positions=final.pos,
                              num_chains=vres[chosen_v].num_chains, held_out_sequences=len(held) if o.evaluate else 0)
        return comp, agreement

    # ----- the output plan (tensors streamed from the source, a few transformed) ----------------------------------
    def _plan(self, job: Job, chosen_w: list[torch.Tensor], r_bar: float | None, w_norm: torch.Tensor) -> OutputPlan:
        ck, cfg = job.ck, job.cfg
        kk, ht = cfg.num_aux, cfg.target_hidden_size
        plan = OutputPlan(cfg.model_copy(update={**job.update, "fc_norm": True, "norm_output": True, "norm_before_fc": False}))
        copy_from(ck, plan, skip=("t2d", "input_norm.weight"))
        if cfg.norm_before_fc:
            plan.tensors["fc.weight"] = lambda: scale_columns(ck.tensor("fc.weight", mapped=True), ck.tensor("input_norm.weight"))
            plan.changes.append("norm_before_fc: input_norm.weight folded into fc.weight columns and dropped (fc_norm replaces it)")
        for i in range(kk):
            plan.add(f"fc_norm.{i}.weight", lambda i=i: chosen_w[i].clone(), (ht,))
        plan.inserted = ([f"fc_norm.{i}.weight [{ht}] (layer {job.aux_ids[i]})" for i in range(kk)]
                         + ["config fc_norm: true", "config norm_output: true"])
        if r_bar is not None:
            h = cfg.hidden_size
            plan.tensors["norm.weight"] = lambda: torch.full((h,), r_bar)
            plan.tensors["lm_head.weight"] = lambda: scale_columns(ck.tensor("lm_head.weight", mapped=True), w_norm / r_bar)
            plan.changes.append(f"norm_output compensation: norm.weight = {r_bar:.6g} (flat); lm_head.weight columns scaled by "
                                f"old_norm_weight / {r_bar:.6g} (logits unchanged)")
        return plan


def _feed_pre(h_pre: torch.Tensor, h_post: torch.Tensor) -> torch.Tensor:
    return h_pre


def _mean(x: list[float]) -> float:
    return sum(x) / len(x) if x else 0.0


def choose(results: list[NormCandidate], scale_free: bool) -> str:
    """The fc_norm candidate kept: the highest step-0 agreement (ties within 0.002), then the lowest fc-output error
    (1 - cosine when ``scale_free``), then the simplest (:data:`PREFERENCE`) within 1 % of that error."""
    scored = [r for r in results if r.step0_agreement is not None]
    if scored:
        top = max(r.step0_agreement for r in scored)
        near = [r for r in scored if r.step0_agreement >= top - 0.002]
    else:  # agreement not measured: fc-output error alone
        near = [r for r in results if r.fc_rel_error is not None]
        if not near:
            return "mean-rms"

    def err(r: NormCandidate) -> float:
        if scale_free:
            return 1.0 - (r.fc_cosine if r.fc_cosine is not None else 0.0)
        return r.fc_rel_error if r.fc_rel_error is not None else math.inf

    best_err = min(err(r) for r in near)
    ok = [r for r in near if err(r) <= best_err * 1.01 + 1e-9]
    ok.sort(key=lambda r: PREFERENCE.index(r.method) if r.method in PREFERENCE else 99)
    return ok[0].method
