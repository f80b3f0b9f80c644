"""Target statistics for EAGLE-3.1 norm initialisation, computed in one streaming pass.

For every sequence the target's aux hidden states ``[T, K*Ht]`` (the layers vLLM feeds the drafter, vLLM's id
convention) are folded into running sums and then dropped: nothing but per-token scalars (one RMS per aux layer and
token, for the medians) and a few ``[Ht]`` / ``[K*Ht]`` vectors stays in memory. Position 0 of every sequence is
excluded from the statistics (its hidden state carries a huge activation: RMS ~1,000 where the median is 6-23 on
SmolLM2, see docs/norm-init.md) but its RMS is recorded for the report.

What is estimated (docs/norm-init.md has the derivation):

* per aux layer k: the RMS of ``h_k`` per token -> mean, median, 5/95 % quantiles, and the "source scale"
  ``a_k = rms(h_k) / rho`` with ``rho = rms(cat(h))`` when the source drafter had ``norm_before_fc`` (else 1);
  the scalar initialisations ``fc_norm[k] = mean(a_k)`` or ``median(a_k)`` come from it;
* per channel: the channel RMS (reported; as an initialisation it is known to be worse than ones) and the
  independent per-channel least-squares fit ``w_i = E[u_i^2 a] / E[u_i^2]`` (``u`` = the RMS-normalised state);
* optionally, with the source's ``fc`` weight, the fits in ``fc``-output space: K scalars (always cheap) and, when
  ``K*Ht`` is small enough, the full per-channel least squares ``min_w E||fc(w * u) - fc(a * u)||^2``.

Precomputed hidden states (``--hidden-states DIR``) are read by :mod:`eagle_migrate.hidden_states`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, Field

from .errors import DataError

#: largest K*Ht for which the full [K*Ht, K*Ht] least-squares system is accumulated (3 x 2048 = Llama-1B size)
FULL_LSTSQ_MAX_DIM = 6144


def rms(x: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """RMS over the last dimension, in fp32."""
    xf = x.float()
    return torch.sqrt(xf.pow(2).mean(-1) + eps)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` in fp32 (what vLLM's RMSNorm does before its weight)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class LayerStatistics(BaseModel):
    """Statistics of one aux layer's hidden state over the calibration tokens (position 0 excluded)."""

    layer_id: int = Field(..., description="aux layer id, vLLM convention (residual stream after i layers)")
    chunk: int = Field(..., description="index k of this layer's chunk in fc's input (ascending layer ids)")
    rms_mean: float = Field(..., description="mean over tokens of the per-token RMS")
    rms_median: float
    rms_p05: float
    rms_p95: float
    rms_first_position: float | None = Field(None, description="mean RMS at position 0 (excluded from the rest)")
    scale_mean: float = Field(..., description="mean of a_k = rms(h_k)/rho (rho = rms of the concat under norm_before_fc, else 1)")
    scale_median: float
    channel_rms_min: float = Field(..., description="smallest per-channel RMS")
    channel_rms_max: float = Field(..., description="largest per-channel RMS (outlier channels)")
    channel_rms_median: float


class TargetStatistics(BaseModel):
    """What the norm initialisation was estimated from."""

    layer_ids: list[int]
    hidden_size: int
    num_sequences: int = 0
    num_tokens: int = Field(0, description="tokens counted (position 0 of every sequence excluded)")
    first_position_excluded: bool = True
    norm_before_fc_source: bool = Field(False, description="the source normalised the concat before fc (a_k is relative)")
    layers: list[LayerStatistics] = Field(default_factory=list)


@dataclass
class Fits:
    """Initialisation candidates for the K fc_norm weights (each a list of K tensors [Ht]). ``warnings``: fits that
    the statistics do not determine (collinear or zero aux states) and were left out, each with the reason."""

    candidates: dict[str, list[torch.Tensor]]
    notes: dict[str, str]
    warnings: list[str] = field(default_factory=list)


#: eigenvalues of a Gram matrix below this fraction of its largest are treated as zero (the sums are float64 of
#: float32 data, whose relative precision ~1e-7 puts a noise floor near 1e-14 on the eigenvalue ratio; 1e-9 means a
#: direction carries less than 3e-5 of the signal's amplitude)
GRAM_RCOND = 1e-9


def solve_psd(g: torch.Tensor, r: torch.Tensor, rcond: float = GRAM_RCOND) -> tuple[torch.Tensor | None, int]:
    """Least-squares solution of ``g x = r`` for a symmetric positive semi-definite ``g`` (a Gram matrix), defined
    when ``g`` is singular: the pseudo-inverse through ``eigh`` with eigenvalues below ``rcond * max`` cut.
    Returns ``(x, rank)``; ``x`` is None when ``g`` is zero or not finite (nothing to solve)."""
    g = g.double()
    if not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(r).all()):
        return None, 0
    ev, vec = torch.linalg.eigh((g + g.T) / 2)
    top = float(ev.max()) if ev.numel() else 0.0
    if top <= 0.0:
        return None, 0
    keep = ev > rcond * top
    inv = torch.where(keep, 1.0 / ev.clamp_min(1e-300), torch.zeros_like(ev))
    x = vec @ (inv * (vec.T @ r.double()))
    return x, int(keep.sum())


class StatsAccumulator:
    """Streaming statistics of the aux hidden states for one drafter.

    ``fc_weight`` ([H, K*Ht], the source fc with any ``input_norm`` weight folded in) enables the fc-space fits.
    """

    def __init__(
        self,
        layer_ids: list[int],
        hidden_size: int,
        *,
        eps: float,
        norm_before_fc: bool = False,
        fc_weight: torch.Tensor | None = None,
        full_lstsq_max_dim: int = FULL_LSTSQ_MAX_DIM,
        device: str | torch.device = "cpu",
    ):
        self.layer_ids = list(layer_ids)
        self.k = len(layer_ids)
        self.ht = hidden_size
        self.eps = eps
        self.norm_before_fc = norm_before_fc
        self.device = torch.device(device)
        d = self.k * self.ht
        self._rms: list[list[torch.Tensor]] = [[] for _ in range(self.k)]
        self._scale: list[list[torch.Tensor]] = [[] for _ in range(self.k)]
        self._first: list[list[float]] = [[] for _ in range(self.k)]
        self._sumsq = torch.zeros(d, dtype=torch.float64, device=self.device)  # raw channel sum of squares
        self._u2 = torch.zeros(d, dtype=torch.float64, device=self.device)  # sum u_i^2
        self._u2a = torch.zeros(d, dtype=torch.float64, device=self.device)  # sum u_i^2 a_k(i)
        self.num_tokens = 0
        self.num_sequences = 0
        # kept in its own dtype (an 8B-shaped fc is 0.2 GiB more in float32); chunks are cast one at a time in update()
        self.fc = fc_weight.to(self.device) if fc_weight is not None else None
        self.full = self.fc is not None and d <= full_lstsq_max_dim
        acc = torch.float64 if d <= 4096 else torch.float32
        if self.fc is not None:
            self._G = torch.zeros(self.k, self.k, dtype=torch.float64, device=self.device)  # sum y_k . y_l
            self._r = torch.zeros(self.k, dtype=torch.float64, device=self.device)  # sum y_k . z
            # the same sums with every token weighted by 1 / ||z||^2 (relative error: the direction of fc's output)
            self._Gw = torch.zeros(self.k, self.k, dtype=torch.float64, device=self.device)
            self._rw = torch.zeros(self.k, dtype=torch.float64, device=self.device)
        if self.full:
            self._U = torch.zeros(d, d, dtype=acc, device=self.device)  # sum u u^T
            self._C = torch.zeros(d, d, dtype=acc, device=self.device)  # sum u (a*u)^T
            self._Uw = torch.zeros(d, d, dtype=acc, device=self.device)  # the same, tokens weighted by 1 / ||z||^2
            self._Cw = torch.zeros(d, d, dtype=acc, device=self.device)

    # ----- streaming -----------------------------------------------------------------------------------------
    def split(self, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """aux [T, K*Ht] -> (u [T, K*Ht] normalised per chunk, a [T, K] source scales, raw rms [T, K])."""
        t = aux.shape[0]
        h = aux.float().view(t, self.k, self.ht)
        r = torch.sqrt(h.pow(2).mean(-1) + self.eps)  # [T, K]  (vLLM RMSNorm's denominator)
        u = (h / r.unsqueeze(-1)).view(t, -1)
        if self.norm_before_fc:
            rho = torch.sqrt(h.pow(2).mean(dim=(1, 2)) + self.eps)  # [T]
            a = r / rho.unsqueeze(-1)
        else:
            a = r
        return u, a, r

    @torch.no_grad()
    def update(self, aux: torch.Tensor, first_is_position_zero: bool = True) -> None:
        """Add one sequence's aux states ``[T, K*Ht]`` (or ``[1, T, K*Ht]``)."""
        if aux.dim() == 3:
            aux = aux[0]
        if aux.shape[-1] != self.k * self.ht:
            raise DataError(f"aux hidden states are {aux.shape[-1]} wide, expected K*Ht = {self.k}*{self.ht} = {self.k * self.ht}")
        aux = aux.to(self.device)
        self.num_sequences += 1
        if first_is_position_zero:
            r0 = rms(aux[:1].view(1, self.k, self.ht))[0]
            for k in range(self.k):
                self._first[k].append(float(r0[k]))
            aux = aux[1:]
        if aux.shape[0] == 0:
            return
        u, a, r = self.split(aux)
        for k in range(self.k):
            self._rms[k].append(r[:, k].cpu())
            self._scale[k].append(a[:, k].cpu())
        self.num_tokens += aux.shape[0]
        self._sumsq += aux.double().pow(2).sum(0)
        u2 = u.double().pow(2)
        self._u2 += u2.sum(0)
        a_exp = a.double().repeat_interleave(self.ht, dim=1)  # [T, K*Ht]
        self._u2a += (u2 * a_exp).sum(0)
        if self.fc is not None:
            t = u.shape[0]
            uk = u.view(t, self.k, self.ht)
            # [T, K, H]: fc_k applied to chunk k, one float32 chunk of fc at a time (no [H, K*Ht] float32 copy)
            y = torch.stack([uk[:, k] @ self.fc[:, k * self.ht:(k + 1) * self.ht].float().T for k in range(self.k)], 1).double()
            z = (y * a.double().unsqueeze(-1)).sum(1)  # [T, H] the source's fc output
            self._G += torch.einsum("tkh,tlh->kl", y, y)
            self._r += torch.einsum("tkh,th->k", y, z)
            wt = 1.0 / z.pow(2).sum(-1).clamp_min(1e-30)  # [T]
            self._Gw += torch.einsum("tkh,tlh,t->kl", y, y, wt)
            self._rw += torch.einsum("tkh,th,t->k", y, z, wt)
        if self.full:
            uu = u.to(self._U.dtype)
            ua = uu * a_exp.to(self._U.dtype)
            self._U += uu.T @ uu
            self._C += uu.T @ ua
            uw = uu * wt.to(self._U.dtype).unsqueeze(-1)
            self._Uw += uw.T @ uu
            self._Cw += uw.T @ ua

    # ----- results -------------------------------------------------------------------------------------------
    def _cat(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts) if parts else torch.zeros(0)

    def statistics(self) -> TargetStatistics:
        if self.num_tokens == 0:
            raise DataError("no tokens to estimate statistics from (every sequence was a single token?)",
                            "pass longer calibration sequences (--data) or more of them")
        layers = []
        ch = torch.sqrt(self._sumsq / self.num_tokens).float().cpu().view(self.k, self.ht)
        for k, lid in enumerate(self.layer_ids):
            r = self._cat(self._rms[k])
            a = self._cat(self._scale[k])
            q = torch.quantile(r[: 1 << 24].float(), torch.tensor([0.05, 0.95])) if r.numel() else torch.zeros(2)
            layers.append(LayerStatistics(
                layer_id=lid, chunk=k,
                rms_mean=float(r.mean()), rms_median=float(r.median()), rms_p05=float(q[0]), rms_p95=float(q[1]),
                rms_first_position=(sum(self._first[k]) / len(self._first[k])) if self._first[k] else None,
                scale_mean=float(a.mean()), scale_median=float(a.median()),
                channel_rms_min=float(ch[k].min()), channel_rms_max=float(ch[k].max()), channel_rms_median=float(ch[k].median()),
            ))
        return TargetStatistics(layer_ids=self.layer_ids, hidden_size=self.ht, num_sequences=self.num_sequences,
                                num_tokens=self.num_tokens, norm_before_fc_source=self.norm_before_fc, layers=layers)

    def fits(self, ridge: float = 1e-3) -> Fits:
        """Every initialisation candidate for the fc_norm weights."""
        st = self.statistics()
        k, ht = self.k, self.ht
        cand: dict[str, list[torch.Tensor]] = {}
        notes: dict[str, str] = {}
        cand["ones"] = [torch.ones(ht) for _ in range(k)]
        cand["mean-rms"] = [torch.full((ht,), st.layers[i].scale_mean) for i in range(k)]
        cand["median-rms"] = [torch.full((ht,), st.layers[i].scale_median) for i in range(k)]
        ch = torch.sqrt(self._sumsq / self.num_tokens).float().cpu().view(k, ht)
        if self.norm_before_fc:
            # the source saw h / rho: per-channel RMS of that is channel RMS scaled by E[1/rho]-ish; use the ratio
            ratio = torch.tensor([st.layers[i].scale_mean / max(st.layers[i].rms_mean, 1e-12) for i in range(k)])
            ch = ch * ratio.unsqueeze(-1)
        cand["channel-rms"] = [ch[i].clone() for i in range(k)]
        diag = (self._u2a / self._u2.clamp_min(1e-30)).float().cpu().view(k, ht)
        cand["lstsq-channel-independent"] = [diag[i].clone() for i in range(k)]
        notes["lstsq-channel-independent"] = "w_i = E[u_i^2 a] / E[u_i^2] per channel, ignoring fc"
        warnings: list[str] = []
        if self.fc is not None:
            p = self.fc.double().T @ self.fc.double() if self.full else None  # [D, D]
            fallback = "; the per-layer mean-RMS initialisation (mean-rms) stands in for it"
            for suffix, g, r, u_m, c_m, what in (
                ("", self._G, self._r, getattr(self, "_U", None), getattr(self, "_C", None), ""),
                ("-relative", self._Gw, self._rw, getattr(self, "_Uw", None), getattr(self, "_Cw", None),
                 ", every token weighted by 1/||fc(a*u)||^2 (fits the direction of fc's output, what hidden_norm sees)"),
            ):
                c, rank = solve_psd(g, r)
                if c is None or rank < k:
                    why = ("the aux states seen through fc are zero (or not finite)" if c is None else
                           f"the K={k} aux states seen through fc are collinear (rank {rank} of {k}: identical or "
                           "proportional aux layers, e.g. duplicate ids or layers that add nothing to the residual)")
                    msg = f"lstsq-scalar{suffix} and lstsq-channel{suffix} not fitted: {why}, so the K scalars are not determined"
                    notes["lstsq-scalar" + suffix] = notes["lstsq-channel" + suffix] = "skipped: " + msg + fallback
                    warnings.append(msg + fallback)
                    continue
                cand["lstsq-scalar" + suffix] = [torch.full((ht,), float(c[i])) for i in range(k)]
                notes["lstsq-scalar" + suffix] = "K scalars minimising E||fc(c*u) - fc(a*u)||^2" + what
                if self.full:
                    a_mat = p * u_m.double()
                    b = (p * c_m.double()).sum(1)
                    # ridge towards lstsq-scalar, scaled to the system (positive definite whenever a_mat is not zero)
                    lam = ridge * float(torch.diagonal(a_mat).abs().mean())
                    w0 = torch.cat([torch.full((ht,), float(c[i]), dtype=torch.float64, device=p.device) for i in range(k)])
                    w, info = torch.linalg.solve_ex(a_mat + lam * torch.eye(a_mat.shape[0], dtype=a_mat.dtype, device=a_mat.device), b + lam * w0)
                    if lam <= 0.0 or int(info) != 0 or not bool(torch.isfinite(w).all()):
                        msg = f"lstsq-channel{suffix} not fitted: its per-channel system is singular even with the ridge"
                        notes["lstsq-channel" + suffix] = "skipped: " + msg
                        warnings.append(msg)
                        continue
                    w = w.float().cpu().view(k, ht)
                    cand["lstsq-channel" + suffix] = [w[i].clone() for i in range(k)]
                    notes["lstsq-channel" + suffix] = (f"per-channel weights minimising E||fc(w*u) - fc(a*u)||^2 "
                                                       f"(ridge {ridge} towards lstsq-scalar{suffix})" + what)
                else:
                    notes["lstsq-channel" + suffix] = (f"skipped: K*Ht = {k * ht} > {FULL_LSTSQ_MAX_DIM} "
                                                       "(the [K*Ht]^2 system would not fit comfortably)")
        return Fits(cand, notes, warnings)


def quantiles_summary(values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {"mean": math.nan, "median": math.nan}
    v = values.float()
    return {"mean": float(v.mean()), "median": float(v.median()), "min": float(v.min()), "max": float(v.max())}
