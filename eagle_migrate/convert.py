"""``convert``: EAGLE-2 / EAGLE-3 drafter -> EAGLE-3.1 (``fc_norm`` + ``norm_output``) that vLLM loads.

The converted drafter is initialised to behave like the source before any training (docs/norm-init.md):

* ``fc_norm.{k}.weight`` from target statistics on calibration data (aux hidden states at exactly the layers vLLM
  feeds), candidates compared on held-out sequences by step-0 top-1 agreement with the source;
* ``norm_output``: the fed-back state changes from ``h_pre`` to ``norm(h_pre)``; compensated by a flat final norm
  ``R`` (the typical RMS of ``h_pre``) with the old norm weight and ``1/R`` folded into ``lm_head`` — logits are
  unchanged exactly, the fed-back state equals ``h_pre`` up to ``R / rms(h_pre)`` per token;
* ``norm_before_fc`` sources: the ``input_norm`` weight is folded into ``fc`` and ``input_norm`` dropped;
* EAGLE-2 sources: a warm start (mapping in docs/norm-init.md), ``calibration_required: true``.

Tensors are streamed one at a time from the (memory-mapped) source into the output file; the source is never
written to; the output folder appears atomically.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from . import __version__
from .choices import OutputFormat
from .drafter.config import DrafterConfig
from .drafter.load import build_drafter
from .drafter.model import MLP, Attention, EagleDrafter, KVCache, RMSNorm, _rope_inv_freq, _rotate_half  # noqa: F401
from .aux_ids import AuxIds, Convention, eagle2_aux_ids  # noqa: F401  (eagle2_aux_ids: one home, re-exported)
from .errors import DataError, InputError, PairingError, UnsupportedError
from .allocator import fixed_mmap_threshold
from .devices import resolve_device, resolve_dtype
from .formats.io import PlannedTensor, atomic_output_dir, check_output_dir, sha256_files, write_json, write_safetensors_streaming
from .hidden_states import HiddenRecord, iter_hidden_states
from .stats import StatsAccumulator, TargetStatistics, rms_normalize

from .progress import StageProgress as Progress, no_progress  # noqa: E402


# ===== result models ===============================================================================================
class FcNormWeight(BaseModel):
    layer_id: int
    chunk: int
    mean: float
    min: float
    max: float


class NormCandidate(BaseModel):
    """One fc_norm initialisation, measured against the source on held-out sequences."""

    method: str
    step0_agreement: float | None = Field(None, description="top-1 agreement of the step-0 draft with the source's")
    fc_rel_error: float | None = Field(None, description="E||g - g_src||^2 / E||g_src||^2, g = fc output")
    fc_cosine: float | None = Field(None, description="mean cosine between g and g_src (scale-free)")
    chosen: bool = False
    note: str | None = None


class FeedbackVariant(BaseModel):
    name: str
    description: str
    step_agreement: list[float] = Field(default_factory=list, description="top-1 agreement at steps 1..k")
    chosen: bool = False


class NormOutputCompensation(BaseModel):
    """How the switch of the fed-back state to the post-norm one was compensated."""

    applied: bool
    method: str = Field(..., description="fold-rms: norm.weight = R (flat), lm_head *= old_norm_weight / R")
    scale: float | None = Field(None, description="R, the typical RMS of the source's pre-norm output h_pre (position 0 excluded)")
    h_pre_rms_mean: float | None = None
    h_pre_rms_median: float | None = None
    norm_before_residual: bool
    exact: str = Field(..., description="when the compensation is exact")
    variants: list[FeedbackVariant] = Field(default_factory=list)


class Agreement(BaseModel):
    """Top-1 agreement between the converted drafter's drafts and the source's on held-out sequences."""

    step0: float | None = None
    steps: list[float] = Field(default_factory=list, description="steps 1..k of the draft chain (both drafters chain on their own drafts)")
    num_positions: int = 0
    num_chains: int = 0
    held_out_sequences: int = 0


class NormInit(BaseModel):
    method: str = Field(..., description="the fc_norm initialisation kept")
    fc_norm: list[FcNormWeight] = Field(default_factory=list)
    candidates: list[NormCandidate] = Field(default_factory=list)
    statistics: TargetStatistics | None = None
    notes: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list, description="fits the statistics could not determine, and why")


class CalibrationStatus(BaseModel):
    status: Literal["calibrated", "not calibrated"] = "not calibrated"
    required: bool = Field(False, description="the converted drafter needs the calibration fine-tune to be useful (EAGLE-2 sources)")
    reason: str = ""
    improved: bool | None = Field(None, description="the fine-tune beat the initialised drafter on the held-out suites beyond noise (None: not run)")
    worse_than_source: bool | None = Field(None, description="the returned drafter is below the source on a held-out suite beyond noise (None: not judged)")
    verdict: str | None = Field(None, description="one plain line: how the returned drafter compares with the source")
    details: dict[str, Any] | None = None


class Eagle2Mapping(BaseModel):
    """How an EAGLE-1/2 drafter was mapped onto the EAGLE-3.1 structure (docs/norm-init.md)."""

    aux_layer_ids: list[int]
    hidden_chunk: int = Field(..., description="fc chunk that carries the old fc's hidden half")
    embedding_rms: float
    fc_output_rms: float
    output_rms: float
    fc_bias: str
    notes: list[str] = Field(default_factory=list)


class Provenance(BaseModel):
    tool: str = "eagle-migrate"
    version: str = __version__
    command: str
    source: str
    source_sha256: str = Field(..., description="sha256 over the source's weight files (names and bytes)")
    source_files: list[str]
    source_format: str
    source_producer: str
    target: str
    target_config_sha256: str | None = None
    data: str | None = None
    hidden_states_dir: str | None = None
    num_sequences: int = 0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    output_format: str = "vllm"
    norm_init: str | None = None
    norm_output_scale: float | None = None
    calibration_required: bool = False
    calibration: str = "not calibrated"
    calibration_verdict: str | None = None
    statistics: TargetStatistics | None = None
    aux_ids: AuxIds | None = Field(None, description="stored aux ids, their convention and how it was decided")
    started_at: str
    finished_at: str | None = None
    python: str = platform.python_version()
    torch: str = torch.__version__


class ConvertResult(BaseModel):
    """What ``convert`` did (printed by ``eagle-migrate convert --json``)."""

    source: str
    output: str
    source_format: str
    source_producer: str
    output_format: str
    passthrough: bool = Field(False, description="the source was already EAGLE-3.1 and was re-written as it is")
    inserted: list[str] = Field(default_factory=list, description="tensors and flags added")
    changes: list[str] = Field(default_factory=list, description="everything else that differs from the source")
    aux_layer_ids: list[int] = Field(default_factory=list)
    aux_ids_evidence: AuxIds | None = Field(None, description="stored ids, both readings, the decision and its evidence (a measurement's numbers)")
    norm_init: NormInit | None = None
    norm_output: NormOutputCompensation | None = None
    eagle2_mapping: Eagle2Mapping | None = None
    agreement: Agreement = Field(default_factory=Agreement)
    calibration: CalibrationStatus = Field(default_factory=CalibrationStatus)
    calibration_required: bool = False
    output_files: list[str] = Field(default_factory=list)
    provenance: Provenance
    warnings: list[str] = Field(default_factory=list)


# ===== small helpers ===============================================================================================
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_aux_ids(num_target_layers: int, k: int = 3) -> list[int]:
    """vLLM's default ids as vLLM captures them (:func:`eagle_migrate.aux_ids.vllm_default_aux_ids`); PairingError
    when they are not ``k`` distinct layers (vLLM would crash on the first request)."""
    from .aux_ids import pairing_error, vllm_default_aux_ids

    err = pairing_error(None, k, num_target_layers)
    if err:
        raise PairingError(err, "pass a drafter that records its eagle_aux_hidden_state_layer_ids")
    return vllm_default_aux_ids(num_target_layers)


# ===== pairing =====================================================================================================
def check_pairing(cfg: DrafterConfig, tinfo: Any, aux_ids: list[int] | None) -> None:
    """Raise PairingError (exit 2) when drafter and target cannot work together; the message names both numbers.
    ``aux_ids`` (vLLM convention; None = not yet known) go through :func:`eagle_migrate.aux_ids.check_aux_ids`."""
    t = tinfo
    if cfg.generation == "eagle2":
        if cfg.hidden_size != t.hidden_size:
            raise PairingError(f"hidden size mismatch: the EAGLE-2 drafter's fc reads the target's last hidden state of size "
                               f"H={cfg.hidden_size}, but the target {t.path} has hidden_size={t.hidden_size}")
    elif cfg.target_hidden_size != t.hidden_size:
        raise PairingError(f"target hidden size mismatch: the drafter expects Ht={cfg.target_hidden_size} (fc takes K*Ht = "
                           f"{cfg.num_aux}*{cfg.target_hidden_size} = {cfg.num_aux * cfg.target_hidden_size}) but the target "
                           f"{t.path} has hidden_size={t.hidden_size}")
    if cfg.vocab_size != t.vocab_size:
        raise PairingError(f"vocabulary mismatch: the drafter has vocab_size={cfg.vocab_size} but the target {t.path} has "
                           f"vocab_size={t.vocab_size}")
    if cfg.draft_vocab_size > t.vocab_size:
        raise PairingError(f"vocabulary mismatch: draft_vocab_size={cfg.draft_vocab_size} exceeds the target's "
                           f"vocab_size={t.vocab_size}")
    if cfg.generation == "eagle3" and aux_ids is not None:
        from .aux_ids import pairing_error

        err = pairing_error(aux_ids, cfg.num_aux, t.num_layers)
        if err:
            raise PairingError(err + " (vLLM convention)")


# ===== target side: weights, sequences, hidden states ==============================================================
class _TargetSide:
    """The target: config, optional transformers model (loaded on first need), a few weights, aux capture."""

    def __init__(self, spec: str, device: str, dtype: torch.dtype):
        from .target import target_info

        self.spec = spec
        self.info = target_info(spec)
        self.device = device
        self.dtype = dtype
        self._target = None
        self._store = None

    @property
    def loaded(self):
        if self._target is None:
            from .target import load_target

            dm = "auto" if self.device.startswith("cuda") and importlib.util.find_spec("accelerate") else None
            self._target = load_target(self.spec, device=self.device, dtype=self.dtype, device_map=dm)
        return self._target

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    _NAMES = {
        "embed": ["model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight", "transformer.wte.weight"],
        "lm_head": ["lm_head.weight"],
        "norm": ["model.norm.weight", "norm.weight", "model.language_model.norm.weight", "transformer.ln_f.weight"],
    }

    def _weight_store(self):
        if self._store is None:
            from .formats.io import TensorStore, open_checkpoint_path

            p = Path(self.spec).expanduser()
            if not p.is_dir():
                return None
            try:
                folder, files, _ = open_checkpoint_path(p)
            except InputError:
                return None
            self._store = TensorStore(folder, files)
        return self._store

    def weight(self, kind: Literal["embed", "lm_head", "norm"], mapped: bool = False) -> torch.Tensor:
        """embed [V, Ht], lm_head [V, Ht], final norm [Ht]: from the loaded model, else read lazily from the folder
        (float32). ``mapped``: from a safetensors folder, a read-only memory-mapped view in the stored dtype (no copy;
        only the rows that are looked up are ever read) -- what the embedding needs."""
        if self._target is None:
            store = self._weight_store()
            if store is not None:
                for n in self._NAMES[kind]:
                    if n in store:
                        return store.mapped(n) if mapped else store.get(n).float()
                if kind == "lm_head":  # tied embeddings
                    return self.weight("embed", mapped=mapped)
        tg = self.loaded
        if kind == "embed":
            return tg.embed_weight.detach().float().cpu()
        if kind == "lm_head":
            return tg.lm_head_weight.detach().float().cpu()
        w = tg.final_norm_weight
        if w is None:
            raise UnsupportedError(f"{self.spec}: cannot find the target's final norm weight")
        w = w.detach().float().cpu()
        # Gemma-style (1 + w) norms are not Llama RMSNorms; the drafter world is Llama-style
        return w

    @torch.no_grad()
    def capture(self, seqs: list[list[int]], aux_ids: list[int], want_last: bool) -> Iterator[HiddenRecord]:
        """Aux states at vLLM ids (transformers ``output_hidden_states[i]``; id L before the final norm), one
        sequence at a time; ``last`` is the post-norm final state."""
        from .target import vllm_hidden_states

        tg = self.loaded
        model = tg.model
        base = model.get_decoder() if hasattr(model, "get_decoder") else model
        for seq in seqs:
            ids = torch.tensor([seq], dtype=torch.long, device=tg.device)
            with vllm_hidden_states(model, self.info.num_layers, aux_ids) as states:
                out = base(input_ids=ids, output_hidden_states=True, use_cache=False)
                hs = states(out.hidden_states)
            aux = torch.cat([hs[i][0] for i in sorted(aux_ids)], dim=-1).float()
            last = out.hidden_states[-1][0].float() if want_last else None
            yield HiddenRecord(ids[0].cpu(), aux, last)
            del out, hs


def _random_sequences(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def calibration_sequences(data: str | None, target: _TargetSide, num_sequences: int, seed: int, max_length: int) -> list[list[int]]:
    """Token-id sequences to estimate statistics on: :func:`eagle_migrate.data.calibration_sequences` (every
    ``--data`` source it reads, whole conversations where they carry replies) with the target's tokenizer. No
    ``--data`` and a tokenizer-less (toy) target: random token sequences instead of byte-rendered text."""
    from .data import calibration_sequences as from_source

    tok = target.tokenizer
    if data is None and tok is None:
        return _random_sequences(target.info.vocab_size, num_sequences, min(max_length, 64), seed)
    return from_source(data, tok, target.info.vocab_size, num_sequences, max_length, seed)


# ===== drafter modules ==============================================================================================
def _float_dtype(store_dtypes: list[str]) -> torch.dtype:
    for d in store_dtypes:
        if d in ("bfloat16", "float16", "float32"):
            return getattr(torch, d)
    return torch.bfloat16


class Eagle2Reference(nn.Module):
    """EAGLE-1/2 as SafeAILab runs it (``cnets1.py``): ``z = fc(cat(embed(tok), f)) (+ bias)``; layer 0 has no
    input_layernorm; no final norm; logits = target ``lm_head(h)``; ``h`` is fed back as the next ``f``."""

    def __init__(self, cfg: DrafterConfig, tensors: dict[str, torch.Tensor], lm_head: torch.Tensor, device: str, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias="fc.bias" in tensors)
        self.layers = nn.ModuleList()
        for i in range(cfg.num_layers):
            layer = nn.Module()
            layer.self_attn = Attention(cfg, h)
            layer.mlp = MLP(cfg)
            layer.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
            if i > 0:
                layer.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
            self.layers.append(layer)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        sd = {n: t for n, t in tensors.items() if n.startswith(("fc.", "layers.", "embed_tokens."))}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if unexpected or [m for m in missing if not m.endswith("bias")]:
            raise InputError(f"EAGLE-2 weights do not fit: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.register_buffer("lm_head", lm_head.to(dtype), persistent=False)
        inv, scale = _rope_inv_freq(cfg)
        self.register_buffer("_inv_freq", inv, persistent=False)
        self._rope_scale = scale
        self.to(device=device, dtype=dtype)
        self._inv_freq = inv.to(device)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float().unsqueeze(-1) * self._inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self._rope_scale).to(dtype), (emb.sin() * self._rope_scale).to(dtype)

    def forward_step(self, input_ids: torch.Tensor, f: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        e = self.embed_tokens(input_ids).to(f.dtype)
        x = self.fc(torch.cat([e, f], dim=-1))
        cos, sin = self.rope(positions, x.dtype)
        t = input_ids.shape[1]
        mask = None
        if t > 1:
            past = cache.length if cache is not None else 0
            q_idx = torch.arange(t, device=x.device).unsqueeze(1) + past
            mask = (torch.arange(past + t, device=x.device).unsqueeze(0) <= q_idx)[None, None]
        residual = None
        out = x
        for i, layer in enumerate(self.layers):
            if i == 0:
                residual = x
                inp = x
            else:
                residual = out + residual
                inp = layer.input_layernorm(residual)
            a, _, _ = layer.self_attn(inp, cos, sin, mask, cache, i)
            residual = a + residual
            out = layer.mlp(layer.post_attention_layernorm(residual))
        return out + residual

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.lm_head.T


# ===== agreement ===================================================================================================
@dataclass
class _Prefill:
    top1: torch.Tensor  # [T-1] target ids drafted at step 0
    h_pre: torch.Tensor  # [T-1, H]
    h_post: torch.Tensor  # [T-1, H]
    cache: KVCache


@dataclass
class _Runner:
    """One drafter as evaluated: how step 0's input g is made, how steps run, what is fed back."""

    prefill: Callable[[HiddenRecord], _Prefill]
    step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, KVCache], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    feed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (h_pre, h_post) -> fed-back state


def _eagle3_runner(m: EagleDrafter, gfn: Callable[[torch.Tensor], torch.Tensor], feed: Callable, device: str, dtype: torch.dtype) -> _Runner:
    def prefill(rec: HiddenRecord) -> _Prefill:
        ids = rec.input_ids.to(device)
        t = ids.shape[0]
        aux = rec.aux[: t - 1].to(device=device, dtype=dtype)
        g = gfn(aux).unsqueeze(0)
        cache = KVCache()
        pos = torch.arange(t - 1, device=device).unsqueeze(0)
        o = m.forward_step(ids[1:].unsqueeze(0), g, pos, cache=cache)
        top1 = m.to_target_ids(m.logits(o.h_post).argmax(-1))[0]
        return _Prefill(top1, o.h_feed[0], o.h_post[0], cache)

    def step(tok: torch.Tensor, fed: torch.Tensor, pos: torch.Tensor, cache: KVCache):
        o = m.forward_step(tok.view(1, 1), fed.view(1, 1, -1), pos.view(1, 1), cache=cache)
        top1 = m.to_target_ids(m.logits(o.h_post).argmax(-1)).view(())
        return top1, o.h_feed.view(-1), o.h_post.view(-1)

    return _Runner(prefill, step, feed)


def _eagle2_runner(ref: Eagle2Reference, device: str, dtype: torch.dtype) -> _Runner:
    def prefill(rec: HiddenRecord) -> _Prefill:
        if rec.last is None:
            raise DataError("EAGLE-2 agreement needs the target's post-norm last hidden state (hidden-states layouts with 'last' / 'hidden_state')")
        ids = rec.input_ids.to(device)
        t = ids.shape[0]
        f = rec.last[: t - 1].to(device=device, dtype=dtype).unsqueeze(0)
        cache = KVCache()
        pos = torch.arange(t - 1, device=device).unsqueeze(0)
        h = ref.forward_step(ids[1:].unsqueeze(0), f, pos, cache)
        top1 = ref.logits(h).argmax(-1)[0]
        return _Prefill(top1, h[0], h[0], cache)

    def step(tok, fed, pos, cache):
        h = ref.forward_step(tok.view(1, 1), fed.view(1, 1, -1), pos.view(1, 1), cache)
        return ref.logits(h).argmax(-1).view(()), h.view(-1), h.view(-1)

    return _Runner(prefill, step, lambda h_pre, h_post: h_pre)


def _truncate(cache: KVCache, n: int) -> KVCache:
    return KVCache(keys=[k[:, :, :n] for k in cache.keys], values=[v[:, :, :n] for v in cache.values])


def _cuts(t: int, max_cuts: int, k: int) -> list[int]:
    lo, hi = 1, t - 2
    if hi < lo:
        return []
    n = min(max_cuts, hi - lo + 1)
    return sorted({lo + round(i * (hi - lo) / max(n - 1, 1)) for i in range(n)})


def _chains(r: _Runner, pf: _Prefill, cuts: list[int], k: int, device: str) -> list[list[int]]:
    out = []
    for p in cuts:
        cache = _truncate(pf.cache, p + 1)
        tok = pf.top1[p]
        fed = r.feed(pf.h_pre[p], pf.h_post[p])
        chain = [int(tok)]
        for j in range(1, k + 1):
            tok, h_pre, h_post = r.step(tok, fed, torch.tensor(p + j, device=device), cache)
            fed = r.feed(h_pre, h_post)
            chain.append(int(tok))
        out.append(chain)
    return out


class _Counter:
    def __init__(self, k: int):
        self.pos = 0
        self.agree0 = 0
        self.chains = 0
        self.agree = [0] * k

    def add_step0(self, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = a[1:], b[1:]  # position 0 (first token's state) excluded
        self.pos += a.numel()
        self.agree0 += int((a == b).sum())

    def add_chains(self, src: list[list[int]], cand: list[list[int]]) -> None:
        for s, c in zip(src, cand):
            self.chains += 1
            for j in range(1, len(s)):
                self.agree[j - 1] += int(s[j] == c[j])

    def result(self, held: int) -> Agreement:
        return Agreement(
            step0=self.agree0 / self.pos if self.pos else None,
            steps=[a / self.chains for a in self.agree] if self.chains else [],
            num_positions=self.pos, num_chains=self.chains, held_out_sequences=held,
        )


# ===== calibration hook ============================================================================================
def _run_calibration(ckpt_dir: Path, ctx: dict[str, Any]) -> CalibrationStatus:
    """The calibration fine-tune (:func:`eagle_migrate.calibrate.calibrate_checkpoint`) on the written checkpoint, in place."""
    from .calibrate import calibrate_checkpoint

    res = calibrate_checkpoint(
        ckpt_dir, ctx["target"], data=ctx["data"], hidden_states_dir=ctx["hidden_states_dir"], train=ctx["train"],
        steps=ctx["steps"], seed=ctx["seed"], device=ctx["device"], num_sequences=ctx["num_sequences"],
        cache_dir=ctx["cache_dir"], resume_dir=ctx["resume_dir"], progress=ctx["progress"], in_place=True,
        dtype=ctx["dtype"], loaded_target=ctx["tside"]._target, max_minutes=ctx["max_minutes"],
        source_checkpoint=ctx.get("source"), statistics_tokens=ctx.get("statistics_tokens"))
    kept = ("best step %d of %d" % (res.best_step, res.steps_run) if res.best_step
            else "initial weights kept: the structural conversion is returned")
    j = res.judge
    paired = (f", paired {j.vs_initial.diff:+.3f} +/- {j.vs_initial.se:.3f} over {j.heldout_positions} positions"
              if j is not None and j.vs_initial is not None else "")
    reason = (f"--train {res.train}: held-out simulated AL {res.score_before:.3f} -> {res.score_after:.3f}{paired} ({kept})"
              + (f"; WARNING: {res.warning}" if res.warning else ""))
    return CalibrationStatus(status="calibrated", reason=reason, improved=res.improved,
                             worse_than_source=j.worse_than_source if j else None, verdict=j.verdict if j else None,
                             details=res.model_dump(mode="json"))


# ===== the conversion ==============================================================================================
@dataclass
class _Plan:
    cfg_out: DrafterConfig
    tensors: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)  # output name -> producer
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inserted: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


def convert(
    source: Path | str,
    target: str,
    out: Path | str,
    *,
    data: str | None = None,
    hidden_states_dir: Path | str | None = None,
    num_sequences: int = 32,
    output_format: OutputFormat = "vllm",
    device: str = "auto",
    dtype: str | torch.dtype | None = "auto",
    calibrate: bool | None = None,
    force: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    steps: int | None = None,
    train: str = "norms",
    cache_dir: Path | str | None = None,
    resume_dir: Path | str | None = None,
    num_speculative_tokens: int = 3,
    held_out: int | None = None,
    max_length: int = 512,
    max_cuts: int = 8,
    evaluate: bool = True,
    command: str | None = None,
    max_minutes: float | None = None,
    aux_ids_convention: Convention | None = None,
) -> ConvertResult:
    """Convert an EAGLE-2/EAGLE-3 drafter to EAGLE-3.1 (see the module docstring and docs/norm-init.md).

    ``calibrate``: None = run the calibration fine-tune when it is available and the source is not already
    EAGLE-3.1; True/False force it on/off. ``steps``, ``train`` (norms | norms+fc | all), ``cache_dir`` (target
    features kept on disk), ``resume_dir`` (the fine-tune's checkpoints, to resume an interrupted run) and
    ``max_minutes`` (its wall-clock budget) are passed on to the calibration; ``result.calibration.improved`` says
    whether the fine-tune beat the initialised drafter on the held-out suites (the CLI's ``--require-improvement``
    exits 1 when it did not). ``num_sequences`` calibration sequences are used by the fine-tune; a seeded sample of
    at most :data:`STATS_MAX_SEQUENCES` of them feeds the norm statistics, ``held_out`` of those (default: a
    quarter, 1..16) only for measuring agreement.
    ``evaluate=False`` skips the agreement runs (the source's ``lm_head`` is never loaded): the fc_norm
    candidate is chosen by its fc-output error on the held-out sequences alone.
    ``aux_ids_convention`` (vllm | output-of-layer) overrides how the stored aux ids are read; otherwise a
    writer-unique fingerprint decides, or a measurement on the target (:mod:`eagle_migrate.aux_ids`), and when
    neither decides, PairingError (exit 2) names both readings.
    """
    progress = progress or no_progress
    started = _now()
    source, out = Path(source), Path(out)
    if output_format not in ("vllm", "speculators"):
        raise InputError(f"unknown output format '{output_format}' (vllm or speculators)")
    if not source.exists():
        raise InputError(f"{source}: no such file or folder")
    check_output_dir(out, force, [source, target, data, hidden_states_dir])
    fixed_mmap_threshold()  # freed per-sequence temporaries go back to the OS (see its docstring)
    dev = resolve_device(device)
    cdtype = resolve_dtype(dtype, dev)
    torch.manual_seed(seed)

    from .formats import read_checkpoint

    progress("read source", 0, 1)
    ck = read_checkpoint(source)
    progress("read source", 1, 1)
    cfg = ck.config
    if not cfg.supported_architecture:
        raise UnsupportedError(f"{source}: {cfg.architecture.upper()} drafters are recognised but cannot be converted yet")
    if ck.quantization:
        raise UnsupportedError(f"{source}: the drafter is quantized ({ck.quantization.get('scheme')}); convert the unquantized drafter, then quantize")
    tside = _TargetSide(target, dev, cdtype)
    tinfo = tside.info
    warnings = [f"{f.severity}: {f.message}" for f in ck.findings if f.severity in ("error", "warning")]
    if hidden_states_dir is None and not cfg.is_eagle31:
        from .calibrate import resolve_data

        data, data_warning = resolve_data(data, tside.tokenizer)  # ShareGPT on a real target when it is here
        if data_warning and tside.tokenizer is not None:
            warnings.append(data_warning)

    mode = "passthrough" if cfg.is_eagle31 else cfg.generation
    check_pairing(cfg, tinfo, None)
    aux = None
    if mode == "eagle2":
        aux_ids = eagle2_aux_ids(tinfo.num_layers)
    else:
        from . import aux_ids as _aux

        progress("aux ids", 0, 1)
        aux = _aux.resolve_for_target(ck, tside, override=aux_ids_convention, seed=seed, data=data)
        progress("aux ids", 1, 1)
        if aux.stored is not None:
            if not aux.decided:
                hint = _aux.UNDECIDED_HINT if aux.measurement is not None else "a drafter for this target records aux ids within 0..L"
                raise PairingError(_aux.undecided_message(aux, tinfo.num_layers, cfg.num_aux), hint)
            _aux.apply(ck, aux)
            cfg = ck.config
            aux_ids = aux.ids
            if aux.decided_by in ("measurement", "unambiguous", "override"):
                warnings += [f"{f.severity}: {f.message}" for f in _aux.findings(aux, ck.producer)]
        else:
            if cfg.num_aux != 3:
                raise PairingError(f"the drafter fuses K={cfg.num_aux} aux states but records no aux layer ids (vLLM's default has 3)")
            aux_ids = default_aux_ids(tinfo.num_layers)
            warnings.append(f"no aux layer ids in the source: vLLM's default {aux_ids} for a {tinfo.num_layers}-layer target written explicitly")
    check_pairing(cfg, tinfo, aux_ids)
    aux_ids = sorted(aux_ids)

    source_files = [str(f) for f in ck.store.files]
    progress("hash source", 0, 1)
    src_sha = sha256_files(ck.store.files)
    progress("hash source", 1, 1)
    tcfg_path = Path(target).expanduser() / "config.json"
    tcfg_sha = sha256_files([tcfg_path]) if tcfg_path.is_file() else None
    cmd = command if command is not None else " ".join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])
    prov = Provenance(command=cmd, source=str(source), source_sha256=src_sha, source_files=[Path(f).name for f in source_files],
                      source_format=ck.format, source_producer=ck.producer, target=target, target_config_sha256=tcfg_sha,
                      data=data, hidden_states_dir=str(hidden_states_dir) if hidden_states_dir else None, seed=seed,
                      device=dev, dtype=str(cdtype).removeprefix("torch."), output_format=output_format, started_at=started,
                      aux_ids=aux)
    store_dtype = _float_dtype([ck.info(n).dtype for n in ("fc.weight", "norm.weight", "layers.0.post_attention_layernorm.weight") if ck.has(n)])

    # rope / positions consistent with the target
    base_changes: list[str] = []
    upd: dict[str, Any] = {"aux_layer_ids": aux_ids}
    if (cfg.rope_theta, cfg.rope_scaling) != (tinfo.rope_theta, tinfo.rope_scaling):
        upd.update(rope_theta=tinfo.rope_theta, rope_scaling=tinfo.rope_scaling)
        base_changes.append(f"rope_theta/rope_scaling taken from the target ({cfg.rope_theta}, {cfg.rope_scaling} -> {tinfo.rope_theta}, {tinfo.rope_scaling})")
    tmax = tinfo.max_position_embeddings or cfg.max_position_embeddings
    if tmax > cfg.max_position_embeddings:
        upd["max_position_embeddings"] = int(tmax)
        base_changes.append(f"max_position_embeddings {cfg.max_position_embeddings} -> {tmax} (the target's)")
    if aux is not None and aux.stored is not None and aux.convention == "output-of-layer":
        base_changes.append(f"aux layer ids {aux.stored} (output-of-layer, by {aux.decided_by}) written as vLLM ids {aux_ids} "
                            "(top level and eagle_config)")
    elif aux is None or aux.stored is None or sorted(aux.stored) != aux_ids:
        base_changes.append(f"aux layer ids written explicitly: {aux_ids} (top level and eagle_config)")

    from .calibrate import TRAIN_MODES

    if train not in TRAIN_MODES:  # checked before anything is written (calibration runs last)
        raise InputError(f"--train {train!r}: expected one of {', '.join(TRAIN_MODES)}")
    calib_ctx = {"target": target, "data": data, "hidden_states_dir": hidden_states_dir, "steps": steps, "device": dev,
                 "seed": seed, "progress": progress, "num_sequences": num_sequences, "train": train,
                 "cache_dir": cache_dir, "resume_dir": resume_dir, "dtype": cdtype, "tside": tside,
                 "max_minutes": max_minutes, "source": source if mode == "eagle3" else None}

    if mode == "passthrough":
        cfg_out = cfg.model_copy(update=upd)
        plan = _Plan(cfg_out)
        for n in ck.canonical_names():
            if n == "t2d" or (n == "d2t" and not cfg_out.uses_d2t):
                continue
            plan.tensors[n] = (lambda n=n: ck.tensor(n))
            plan.shapes[n] = ck.info(n).shape
        plan.changes = base_changes + ["source already EAGLE-3.1: weights and flags re-written as they are"]
        norm_init = None
        comp = None
        agreement = Agreement()
        e2map = None
        calibration_required = False
        want_cal = bool(calibrate)
        stats = None
    else:
        seqs_iter, n_total = _records(tside, data, hidden_states_dir, aux_ids, cfg.target_hidden_size if mode != "eagle2" else tinfo.hidden_size,
                                      min(num_sequences, STATS_MAX_SEQUENCES), seed, max_length, want_last=(mode == "eagle2"))
        n_held = held_out if held_out is not None else max(1, min(16, n_total // 4))
        if n_total - n_held < 1:
            raise DataError(f"{n_total} calibration sequence(s) cannot be split into statistics and held-out sets",
                            "pass more sequences (--num-sequences / --data)")
        if mode == "eagle3":
            plan, norm_init, comp, agreement, stats = _convert_eagle3(
                ck, cfg, upd, tside, seqs_iter, n_total, n_held, aux_ids, dev, cdtype, num_speculative_tokens, max_cuts, progress,
                evaluate=evaluate)
            e2map = None
            calibration_required = False
        else:
            plan, norm_init, comp, agreement, stats, e2map = _convert_eagle2(
                ck, cfg, upd, tside, seqs_iter, n_total, n_held, aux_ids, dev, cdtype, num_speculative_tokens, max_cuts, progress)
            calibration_required = True
        plan.changes = base_changes + plan.changes
        warnings.extend(f"warning: {w}" for w in (norm_init.warnings if norm_init else []))
        want_cal = True if calibrate is None else calibrate
    prov.num_sequences = stats.num_sequences if stats is not None else 0
    prov.statistics = stats
    prov.norm_init = norm_init.method if norm_init else None
    prov.norm_output_scale = comp.scale if comp else None
    prov.calibration_required = calibration_required

    # ----- write ---------------------------------------------------------------------------------------------
    cfg_out = plan.cfg_out
    extra = {"eagle_migrate": {"version": __version__, "converted_from": ck.format, "source_producer": ck.producer,
                               "norm_init": prov.norm_init, "norm_output_scale": prov.norm_output_scale,
                               "calibration_required": calibration_required}}
    meta = {"format": "pt", "producer": f"eagle-migrate {__version__}", "source_sha256": src_sha,
            "eagle_migrate_convert": json.dumps({"from": ck.format, "norm_init": prov.norm_init,
                                                 "norm_output_scale": prov.norm_output_scale,
                                                 "calibration_required": calibration_required})}
    names = _ordered_names(cfg_out, plan)
    calibration = CalibrationStatus(required=calibration_required,
                                    reason="EAGLE-2 warm start: fine-tune required" if calibration_required else "")
    _counting.done = 0
    progress("write", 0, len(names))
    with atomic_output_dir(out, force=force, inputs=[source, target, data, hidden_states_dir]) as tmp:
        if output_format == "vllm":
            from .formats.vllm import vllm_config_dict

            plist = []
            for n in names:
                dt = torch.int64 if n == "d2t" else store_dtype
                plist.append(PlannedTensor(n, tuple(plan.shapes[n]), dt, _counting(plan.tensors[n], progress, len(names))))
            write_safetensors_streaming(tmp / "model.safetensors", plist, meta)
            d = vllm_config_dict(cfg_out, extra)
            d["torch_dtype"] = str(store_dtype).removeprefix("torch.")
            write_json(tmp / "config.json", d)
        else:
            from .formats import write_checkpoint

            sub = tmp / "_speculators"
            write_checkpoint(cfg_out, sub, layout="speculators",
                             tensors=((n, plan.tensors[n]().to(torch.int64 if n == "d2t" else store_dtype)) for n in names),
                             verifier=target, num_speculative_tokens=num_speculative_tokens, extra_config=extra, metadata=meta)
            for f in sub.iterdir():
                os.replace(f, tmp / f.name)
            sub.rmdir()
        progress("write", len(names), len(names))
        # the output must read back as an EAGLE-3.1 drafter with no error
        from .formats import read_checkpoint as _rc

        back = _rc(tmp)
        errs = [f.message for f in back.findings if f.severity == "error"]
        if errs or not back.config.is_eagle31:
            from .errors import CheckpointError

            raise CheckpointError(f"the written checkpoint does not read back cleanly: {'; '.join(errs[:3])}",
                                  "the source itself has these problems (see `eagle-migrate inspect`); nothing was written")
        if want_cal:
            calib_ctx["statistics_tokens"] = stats.num_tokens if stats is not None else None
            cal = _run_calibration(tmp, calib_ctx)
            cal.required = calibration_required
            calibration = cal
            if cal.worse_than_source and cal.verdict:
                warnings.append(cal.verdict)
            calibration_required = False
        else:
            calibration.reason = (calibration.reason + "; " if calibration.reason else "") + "not asked for"
        prov.calibration = calibration.status
        prov.calibration_verdict = calibration.verdict
        prov.calibration_required = calibration_required
        prov.finished_at = _now()
        write_json(tmp / "provenance.json", prov.model_dump(mode="json"))
        files = sorted(p.name for p in tmp.iterdir())
    inserted = list(plan.inserted)
    return ConvertResult(
        source=str(source), output=str(out), source_format=ck.format, source_producer=ck.producer,
        output_format=output_format, passthrough=(mode == "passthrough"), inserted=inserted, changes=plan.changes,
        aux_layer_ids=aux_ids, aux_ids_evidence=aux, norm_init=norm_init, norm_output=comp, eagle2_mapping=e2map, agreement=agreement,
        calibration=calibration, calibration_required=calibration_required, output_files=files, provenance=prov,
        warnings=warnings,
    )


def _counting(fn: Callable[[], torch.Tensor], progress: Progress, total: int) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        t = fn()
        _counting.done = getattr(_counting, "done", 0) + 1
        progress("write", min(_counting.done, total), total)
        return t

    return run


def _ordered_names(cfg: DrafterConfig, plan: _Plan) -> list[str]:
    names = [n for n in plan.tensors if n != "t2d"]
    if not cfg.uses_d2t:
        names = [n for n in names if n != "d2t"]
    return sorted(names)


# the statistics pass (norm initialisation + agreement) runs one sequence at a time and needs few: 32 give 94.6 %
# step-0 agreement on the real pair, 64 give 95.2 % (docs/norm-init.md). More --num-sequences feed the calibration
# fine-tune only (on an H100, 6,000 ShareGPT sequences took 5 min in this pass before the cap)
STATS_MAX_SEQUENCES = 256


def _records(tside: _TargetSide, data, hidden_states_dir, aux_ids, ht, num_sequences, seed, max_length, want_last) -> tuple[Iterator[HiddenRecord], int]:
    """(iterator over calibration records, how many there will be)."""
    if hidden_states_dir is not None:
        from .hidden_states import count_hidden_states

        n = min(count_hidden_states(Path(hidden_states_dir)), num_sequences)
        return iter_hidden_states(Path(hidden_states_dir), aux_ids, ht, limit=n), n
    seqs = calibration_sequences(data, tside, num_sequences, seed, max_length)
    return tside.capture(seqs, aux_ids, want_last), len(seqs)


# ----- EAGLE-3 -> EAGLE-3.1 ------------------------------------------------------------------------------------------
def _split_stream(it: Iterator[HiddenRecord], n_total: int, n_held: int) -> Iterator[tuple[bool, HiddenRecord]]:
    """(is_held_out, record): every ``n_total // n_held``-th record is held out, up to ``n_held``."""
    every = max(2, n_total // n_held)
    held = 0
    for i, rec in enumerate(it):
        is_h = held < n_held and (i % every == every - 1 or n_total - i <= n_held - held)
        held += is_h
        yield is_h, rec


def _scale_columns(w: torch.Tensor, scale: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """``w * scale`` (per column) computed in fp32 ``rows`` rows at a time and stored in ``w``'s dtype: the largest
    tensor (an 8B-shaped lm_head, 250 MiB bf16) used to pass through a float32 copy and a float32 product (1 GiB of
    transients at once: the structural conversion's peak)."""
    s = scale.to(device=w.device, dtype=torch.float32).unsqueeze(0)
    out = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    for i in range(0, w.shape[0], rows):
        out[i : i + rows] = (w[i : i + rows].float() * s).to(w.dtype)
    return out


def _convert_eagle3(ck, cfg: DrafterConfig, upd, tside: _TargetSide, records, n_total, n_held, aux_ids, dev, cdtype, k, max_cuts, progress,
                    evaluate: bool = True):
    ht, kk, eps = cfg.target_hidden_size, cfg.num_aux, cfg.rms_norm_eps
    skip = () if evaluate else ("lm_head.weight",)
    src_t = {n: ck.tensor(n) for n in ck.canonical_names() if n != "t2d" and n not in skip}
    if "embed_tokens.weight" not in src_t:
        src_t["embed_tokens.weight"] = tside.weight("embed", mapped=True)  # only looked-up rows are ever read
    src_cfg = cfg.model_copy(update={"fc_norm": False, "norm_output": False})
    m = build_drafter(src_cfg, src_t, device=dev, dtype=cdtype, allow_missing=skip, what=f"{ck.path}")
    own_embed = ck.has("embed_tokens.weight")
    del src_t
    fc_w = m.fc.weight.detach()  # the module's dtype: no float32 copy of an 8B-sized fc
    fc_fold = _scale_columns(fc_w, m.input_norm.weight.detach()) if cfg.norm_before_fc else fc_w  # input_norm's weight folded in
    acc = StatsAccumulator(aux_ids, ht, eps=eps, norm_before_fc=cfg.norm_before_fc, fc_weight=fc_fold, device=dev)
    held: list[HiddenRecord] = []
    r_pre: list[torch.Tensor] = []
    n_done = 0
    progress("statistics", 0, n_total)
    with torch.no_grad():
        for is_h, rec in _split_stream(records, n_total, n_held):
            if is_h:
                held.append(HiddenRecord(rec.input_ids.cpu(), rec.aux.cpu(), None))
            else:
                acc.update(rec.aux)
                t = rec.input_ids.shape[0]
                aux = rec.aux[: t - 1].to(device=dev, dtype=cdtype)
                o = m.forward_step(rec.input_ids[1:].to(dev).unsqueeze(0), m.combine(aux).unsqueeze(0),
                                   torch.arange(t - 1, device=dev).unsqueeze(0))
                r_pre.append(torch.sqrt(o.h_feed[0, 1:].float().pow(2).mean(-1) + eps).cpu())
            n_done += 1
            progress("statistics", n_done, n_total)
    stats = acc.statistics()
    fits = acc.fits()
    rp = torch.cat(r_pre) if r_pre else torch.ones(1)
    r_bar = float(rp.mean())
    w_norm = m.norm.weight.detach().float()

    def g_src(aux):
        return m.combine(aux)

    def g_cand_fn(ws: list[torch.Tensor]):
        wcat = torch.cat(ws).to(device=dev, dtype=cdtype)
        fcw = fc_fold.to(device=dev, dtype=cdtype)

        def g(aux):
            t = aux.shape[0]
            u = rms_normalize(aux.view(t, kk, ht), eps).to(cdtype).view(t, -1)
            return F.linear(u * wcat, fcw)

        return g

    pre = lambda h_pre, h_post: h_pre  # noqa: E731
    src_runner = _eagle3_runner(m, g_src, pre, dev, cdtype)

    # stage 1: fc_norm candidates by step-0 agreement on held-out sequences
    cands = fits.candidates
    counters = {name: _Counter(k) for name in cands}
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
            gs = g_src(aux)[1:].float()
            for name, ws in cands.items():
                gfn = g_cand_fn(ws)
                if evaluate:
                    c = _eagle3_runner(m, gfn, pre, dev, cdtype).prefill(rec)
                    counters[name].add_step0(s.top1, c.top1)
                gc = gfn(aux)[1:].float()
                err_num[name] += float((gc - gs).pow(2).sum())
                err_den[name] += float(gs.pow(2).sum())
                cos_sum[name] += float(F.cosine_similarity(gc, gs, dim=-1).sum())
                cos_n[name] += gc.shape[0]
            progress("evaluate", i + 1, 2 * len(held))
    results = []
    for name in cands:
        a = counters[name].result(len(held))
        results.append(NormCandidate(method=name, step0_agreement=a.step0,
                                     fc_rel_error=err_num[name] / err_den[name] if err_den[name] else None,
                                     fc_cosine=cos_sum[name] / cos_n[name] if cos_n[name] else None,
                                     note=fits.notes.get(name)))
    best = _choose(results, cfg.norm_before_residual)
    for r in results:
        r.chosen = r.method == best
    chosen_w = cands[best]
    gbest = g_cand_fn(chosen_w)

    # stage 2: what is fed back under norm_output
    variants = {
        "pre-norm": ("norm_output off (EAGLE-3 feedback), for reference", pre),
        "norm_output": ("norm_output with the source's norm and lm_head unchanged", lambda h_pre, h_post: h_post),
        "norm_output+fold-rms": (f"norm_output, norm.weight = R = {r_bar:.4g} (flat), old norm weight and 1/R folded into lm_head",
                                 lambda h_pre, h_post: (rms_normalize(h_pre, eps).to(h_pre.dtype) * r_bar)),
    }
    vcount = {n: _Counter(k) for n in variants}
    final = _Counter(k)
    with torch.no_grad():
        for i, rec in enumerate(held if evaluate else []):
            s = src_runner.prefill(rec)
            cuts = _cuts(rec.input_ids.shape[0], max_cuts, k)
            src_chains = _chains(src_runner, s, cuts, k, dev)
            c = _eagle3_runner(m, gbest, pre, dev, cdtype).prefill(rec)
            final.add_step0(s.top1, c.top1)
            for vname, (_, fb) in variants.items():
                r = _eagle3_runner(m, gbest, fb, dev, cdtype)
                vcount[vname].add_chains(src_chains, _chains(r, c, cuts, k, dev))
            progress("evaluate", len(held) + i + 1, 2 * len(held))
    vres = {n: vcount[n].result(len(held)) for n in variants}
    fold_ok = _mean(vres["norm_output+fold-rms"].steps) >= _mean(vres["norm_output"].steps) - 1e-12  # True when not measured
    chosen_v = "norm_output+fold-rms" if fold_ok else "norm_output"
    comp = NormOutputCompensation(
        applied=fold_ok, method="fold-rms" if fold_ok else "none", scale=r_bar if fold_ok else None,
        h_pre_rms_mean=r_bar, h_pre_rms_median=float(rp.median()), norm_before_residual=cfg.norm_before_residual,
        exact=("exact (hidden_norm and the residual both see a normalised state)" if cfg.norm_before_residual else
               "exact for the attention input; the residual sees h_pre * R / rms(h_pre) instead of h_pre"),
        variants=[FeedbackVariant(name=n, description=variants[n][0], step_agreement=vres[n].steps, chosen=(n == chosen_v)) for n in variants],
    )
    agreement = Agreement(step0=final.result(len(held)).step0, steps=vres[chosen_v].steps, num_positions=final.pos,
                          num_chains=vres[chosen_v].num_chains, held_out_sequences=len(held) if evaluate else 0)

    # ----- output plan (tensors streamed from the source, a few transformed) --------------------------------
    cfg_out = cfg.model_copy(update={**upd, "fc_norm": True, "norm_output": True, "norm_before_fc": False})
    plan = _Plan(cfg_out)
    for n in ck.canonical_names():
        if n in ("t2d", "input_norm.weight") or (n == "d2t" and not cfg_out.uses_d2t):
            continue
        plan.tensors[n] = (lambda n=n: ck.tensor(n))
        plan.shapes[n] = tuple(ck.info(n).shape)
    if cfg.norm_before_fc:
        plan.tensors["fc.weight"] = lambda: _scale_columns(ck.tensor("fc.weight", mapped=True), ck.tensor("input_norm.weight"))
        plan.changes.append("norm_before_fc: input_norm.weight folded into fc.weight columns and dropped (fc_norm replaces it)")
    for i in range(kk):
        plan.tensors[f"fc_norm.{i}.weight"] = (lambda i=i: chosen_w[i].clone())
        plan.shapes[f"fc_norm.{i}.weight"] = (ht,)
    plan.inserted = [f"fc_norm.{i}.weight [{ht}] (layer {aux_ids[i]})" for i in range(kk)] + ["config fc_norm: true", "config norm_output: true"]
    if fold_ok:
        h = cfg.hidden_size
        plan.tensors["norm.weight"] = lambda: torch.full((h,), r_bar)
        wn = w_norm.cpu()
        plan.tensors["lm_head.weight"] = lambda: _scale_columns(ck.tensor("lm_head.weight", mapped=True), wn / r_bar)
        plan.changes.append(f"norm_output compensation: norm.weight = {r_bar:.6g} (flat); lm_head.weight columns scaled by old_norm_weight / {r_bar:.6g} (logits unchanged)")
    if not own_embed:
        pass  # vLLM shares the target's embedding (H = Ht)
    fcn = [FcNormWeight(layer_id=aux_ids[i], chunk=i, mean=float(chosen_w[i].mean()), min=float(chosen_w[i].min()), max=float(chosen_w[i].max())) for i in range(kk)]
    norm_init = NormInit(method=best, fc_norm=fcn, candidates=results, statistics=stats, warnings=fits.warnings,
                         notes={"selection": "highest step-0 agreement on held-out sequences; ties within 0.002 -> lowest fc error "
                                + ("(cosine: norm_before_residual makes the scale of fc's output irrelevant)" if cfg.norm_before_residual else "(relative L2)")})
    return plan, norm_init, comp, agreement, stats


def _mean(x: list[float]) -> float:
    return sum(x) / len(x) if x else 0.0


PREFERENCE = ["mean-rms", "median-rms", "lstsq-scalar", "lstsq-scalar-relative", "lstsq-channel", "lstsq-channel-relative",
              "lstsq-channel-independent", "channel-rms", "ones"]


def _choose(results: list[NormCandidate], scale_free: bool) -> str:
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
    # among the (near-)best, prefer the simplest within 1 % of the lowest error
    ok = [r for r in near if err(r) <= best_err * 1.01 + 1e-9]
    ok.sort(key=lambda r: PREFERENCE.index(r.method) if r.method in PREFERENCE else 99)
    return ok[0].method


# ----- EAGLE-2 -> EAGLE-3.1 ------------------------------------------------------------------------------------------
def _convert_eagle2(ck, cfg: DrafterConfig, upd, tside: _TargetSide, records, n_total, n_held, aux_ids, dev, cdtype, k, max_cuts, progress):
    h, eps, kk = cfg.hidden_size, cfg.rms_norm_eps, len(aux_ids)
    ht = tside.info.hidden_size
    src_t = {n: ck.tensor(n).float() for n in ck.canonical_names()}
    if "embed_tokens.weight" not in src_t:
        src_t["embed_tokens.weight"] = tside.weight("embed")
    lm_head = tside.weight("lm_head")
    w_fn = tside.weight("norm")
    ref = Eagle2Reference(cfg, src_t, lm_head, dev, cdtype)
    fc = src_t["fc.weight"]
    w_e, w_h = fc[:, :h], fc[:, h:]
    bias = src_t.get("fc.bias")
    emb = src_t["embed_tokens.weight"]
    last_chunk = kk - 1
    acc = StatsAccumulator(aux_ids, ht, eps=eps, device=dev)
    held: list[HiddenRecord] = []
    r_out, r_g, r_e = [], [], []
    progress("statistics", 0, n_total)
    with torch.no_grad():
        for i, (is_h, rec) in enumerate(_split_stream(records, n_total, n_held)):
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
                hout = ref.forward_step(rec.input_ids[1:].to(dev).unsqueeze(0), f.unsqueeze(0), torch.arange(t - 1, device=dev).unsqueeze(0))
                r_out.append(torch.sqrt(hout[0, 1:].float().pow(2).mean(-1) + eps).cpu())
                fh = rms_normalize(rec.aux[1: t - 1, last_chunk * ht:], eps) * w_fn
                r_g.append(torch.sqrt((fh @ w_h.T).pow(2).mean(-1) + eps))
                r_e.append(torch.sqrt(emb[rec.input_ids[2:t]].pow(2).mean(-1) + eps))
            progress("statistics", i + 1, n_total)
    stats = acc.statistics()
    rho_out = float(torch.cat(r_out).mean()) if r_out else 1.0
    rho_g = float(torch.cat(r_g).mean()) if r_g else 1.0
    rho_e = float(torch.cat(r_e).mean()) if r_e else 1.0

    # ----- the new weights ----------------------------------------------------------------------------------
    new: dict[str, torch.Tensor] = {}
    fc_new = torch.zeros(h, kk * ht)
    fc_new[:, last_chunk * ht:] = w_h
    new["fc.weight"] = fc_new
    for i in range(kk):
        new[f"fc_norm.{i}.weight"] = w_fn.clone() if i == last_chunk else torch.full((ht,), stats.layers[i].rms_mean)
    attn_bias = cfg.attention_bias or bias is not None
    for x in "qkv":
        w = src_t[f"layers.0.self_attn.{x}_proj.weight"]
        new[f"layers.0.self_attn.{x}_proj.weight"] = torch.cat([w @ w_e, w], dim=1)
        if attn_bias:
            b = src_t.get(f"layers.0.self_attn.{x}_proj.bias", torch.zeros(w.shape[0]))
            new[f"layers.0.self_attn.{x}_proj.bias"] = b + (w @ bias if bias is not None else 0)
    new["layers.0.input_layernorm.weight"] = torch.full((h,), rho_e)
    new["layers.0.hidden_norm.weight"] = torch.full((h,), rho_g)
    new["norm.weight"] = torch.full((h,), rho_out)
    new["lm_head.weight"] = lm_head
    for n, t in src_t.items():
        if n.startswith("layers.") and n not in new and not n.startswith("layers.0.self_attn.q_proj") \
                and not n.startswith("layers.0.self_attn.k_proj") and not n.startswith("layers.0.self_attn.v_proj"):
            new[n] = t
    if attn_bias:
        for i in range(cfg.num_layers):
            for x in "qkv":
                nm = f"layers.{i}.self_attn.{x}_proj.bias"
                if nm not in new:
                    new[nm] = torch.zeros(src_t[f"layers.{i}.self_attn.{x}_proj.weight"].shape[0])
            new[f"layers.{i}.self_attn.o_proj.bias"] = torch.zeros(h)  # vLLM builds o_proj with a bias too
    own_embed = ck.has("embed_tokens.weight")
    if own_embed:
        new["embed_tokens.weight"] = emb
    cfg_out = DrafterConfig(**{
        **cfg.model_dump(), **upd, "generation": "eagle3", "target_hidden_size": ht, "num_aux": kk, "draft_vocab_size": cfg.vocab_size,
        "fc_norm": True, "norm_output": True, "norm_before_fc": False, "norm_before_residual": False, "fc_bias": False,
        "has_lm_head": True, "has_embed_tokens": own_embed, "attention_bias": attn_bias,
    })
    conv = build_drafter(cfg_out, {**new, **({} if own_embed else {"embed_tokens.weight": emb})}, device=dev, dtype=cdtype,
                         what="the converted drafter")

    # ----- agreement with the EAGLE-2 source ---------------------------------------------------------------------
    src_runner = _eagle2_runner(ref, dev, cdtype)
    conv_runner = _eagle3_runner(conv, conv.combine, lambda h_pre, h_post: h_post, dev, cdtype)
    cnt = _Counter(k)
    progress("evaluate", 0, len(held))
    with torch.no_grad():
        for i, rec in enumerate(held):
            s = src_runner.prefill(rec)
            c = conv_runner.prefill(rec)
            cnt.add_step0(s.top1, c.top1)
            cuts = _cuts(rec.input_ids.shape[0], max_cuts, k)
            cnt.add_chains(_chains(src_runner, s, cuts, k, dev), _chains(conv_runner, c, cuts, k, dev))
            progress("evaluate", i + 1, len(held))
    agreement = cnt.result(len(held))
    plan = _Plan(cfg_out)
    for n, t in new.items():
        plan.tensors[n] = (lambda t=t: t)
        plan.shapes[n] = tuple(t.shape)
    plan.inserted = [f"fc_norm.{i}.weight [{ht}] (layer {aux_ids[i]})" for i in range(kk)] + [
        "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight (the target's)",
        "config fc_norm: true", "config norm_output: true"]
    plan.changes = [
        f"EAGLE-2 fc [H, 2H] -> fc [H, {kk}*Ht]: hidden half in chunk {last_chunk} (aux layer {aux_ids[last_chunk]}, fc_norm = the target's final norm weight); other chunks zero",
        "embedding half of fc folded into the layer-0 q/k/v embedding columns (q' = [W_q W_e | W_q])",
        "fc.bias folded into q/k/v biases (its contribution to the residual is not representable)" if bias is not None else "no fc.bias",
        f"norm.weight = {rho_out:.6g} (flat, EAGLE-2 had no final norm), lm_head = the target's",
    ]
    m_notes = ["step 0 is near-exact; steps >= 1 feed the drafter's output back without fc (EAGLE-3 structure), which EAGLE-2 applied fc to: calibration required",
               "the token embedding no longer enters the residual stream directly (only through attention)"]
    e2map = Eagle2Mapping(aux_layer_ids=aux_ids, hidden_chunk=last_chunk, embedding_rms=rho_e, fc_output_rms=rho_g, output_rms=rho_out,
                          fc_bias="folded into q/k/v biases" if bias is not None else "none", notes=m_notes)
    norm_init = NormInit(method="eagle2-mapping", statistics=stats,
                         fc_norm=[FcNormWeight(layer_id=aux_ids[i], chunk=i, mean=float(new[f"fc_norm.{i}.weight"].mean()),
                                               min=float(new[f"fc_norm.{i}.weight"].min()), max=float(new[f"fc_norm.{i}.weight"].max())) for i in range(kk)],
                         notes={"chunk": f"chunk {last_chunk}: target final norm weight; others: mean RMS of their layer (their fc columns are zero)"})
    comp = NormOutputCompensation(applied=True, method="fold-rms", scale=rho_out, h_pre_rms_mean=rho_out, norm_before_residual=False,
                                  exact="logits' argmax exact; the fed-back state is h * R / rms(h)")
    return plan, norm_init, comp, agreement, stats, e2map
