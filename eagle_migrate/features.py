"""The target's features for training and judging: its aux states and post-norm last hidden state per position
(labels through :class:`TargetHead`, the target's output layer restricted to the draft vocabulary), in batches
(:class:`FeatureBatch`), computed from the target batch by batch (:class:`FeatureStore`: streamed, cached on disk
as one safetensors file per batch in ``cache_dir``) or read from precomputed files (:class:`PrecomputedFeatures`,
through the one --hidden-states reader). Imports: torch, safetensors, errors, formats.output, hidden_states (the
target's capture comes in as an argument). It never imports train."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .errors import DataError
from .formats.output import atomic_file
from .hidden_states import SpeculatorsOffline, checked, describe_hidden_states, read_file

Progress = Callable[[dict[str, Any]], None]  # an event dict per step of long work (fit's and prefetch's)

@dataclass
class TargetHead:
    """The target's output layer restricted to the draft vocabulary: logits over Vd from its post-norm state."""

    weight: torch.Tensor  # [Vd, Ht]
    bias: torch.Tensor | None = None

    @classmethod
    def from_target(cls, target: Any, t_ids: torch.Tensor, device: torch.device | str = "cpu") -> TargetHead:
        """From anything with ``lm_head_weight`` (and ``lm_head_bias``): a loaded Target or, with --hidden-states,
        :class:`eagle_migrate.target.TargetWeights` (only the draft vocabulary's rows are read)."""
        hw = target.lm_head_weight
        w = hw.detach()[t_ids.to(hw.device)].to(device=device, dtype=torch.float32)
        b = getattr(target, "lm_head_bias", None)
        return cls(w, None if b is None else b.detach()[t_ids.to(b.device)].to(device=device, dtype=torch.float32))

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        out = final.float() @ self.weight.T
        return out if self.bias is None else out + self.bias


@dataclass
class FeatureBatch:
    """One batch of target features. Positions past ``lengths`` are padding (right-padded)."""

    input_ids: torch.Tensor  # [B, T] int64
    aux: torch.Tensor  # [B, T, K*Ht]
    loss_mask: torch.Tensor  # [B, T] bool: the target's prediction at position p (of token p+1) is trained on
    final: torch.Tensor | None = None  # [B, T, Ht] the target's post-norm last hidden state
    target_logits: torch.Tensor | None = None  # [B, T, Vd] already restricted to the draft vocabulary
    lengths: torch.Tensor | None = None  # [B] real lengths (None: every row is T long)
    reference: torch.Tensor | None = None  # [B, T] what drafts are scored against (None: input_ids; HeldoutFromFiles)

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FeatureBatch:
        """Move to ``device``, then cast the float states there: casting first (``x.to(device, dtype)``) makes
        the CPU convert and copies the wider dtype from pageable memory, which on an H100 took a third of a
        calibration step (docs/benchmarks.md)."""

        def cast(x: torch.Tensor) -> torch.Tensor:
            x = x.to(device, non_blocking=x.is_pinned())
            return x if dtype is None else x.to(dtype)

        return FeatureBatch(
            self.input_ids.to(device), cast(self.aux), self.loss_mask.to(device),
            None if self.final is None else cast(self.final),
            None if self.target_logits is None else self.target_logits.to(device), self.lengths, self.reference,
        )

    def labels(self, head: TargetHead | None) -> torch.Tensor:
        if self.target_logits is not None:
            return self.target_logits.float()
        if self.final is None or head is None:
            raise ValueError("a batch needs target_logits, or final states plus a TargetHead")
        return head.logits(self.final)

    def labels_where(self, head: TargetHead | None, where: torch.Tensor) -> torch.Tensor:
        """:meth:`labels` at the positions where ``where`` [B, T] is true only, as [M, Vd] in row-major order."""
        if self.target_logits is not None:
            return self.target_logits[where].float()
        if self.final is None or head is None:
            raise ValueError("a batch needs target_logits, or final states plus a TargetHead")
        return head.logits(self.final[where])


def pad_batch(seqs: Sequence[Sequence[int]], masks: Sequence[Sequence[bool]] | None, seq_len: int, pad_id: int = 0):
    seqs = [list(s)[:seq_len] for s in seqs]
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    lm = torch.zeros((len(seqs), t), dtype=torch.bool)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        if masks is None:
            lm[r, : len(s)] = True
        else:
            m = list(masks[r])[: len(s)]
            lm[r, : len(m)] = torch.tensor(m, dtype=torch.bool)
    return ids, lengths, lm


class FeatureStore:
    """Target features for a list of token sequences, one :class:`FeatureBatch` per ``batch`` sequences.

    Without ``cache_dir`` every access runs the target (streaming: never more than one batch in memory). With it,
    each batch is written once to ``cache_dir/features-<name>-<key>/batch-00000.safetensors`` (``input_ids``,
    ``lengths``, ``loss_mask``, ``aux``, ``final``) and read back afterwards; the key hashes the target, layer ids,
    sequences, masks and shapes, so a changed input never reuses stale features.
    """

    def __init__(
        self,
        target: Any,
        sequences: Sequence[Sequence[int]],
        layer_ids: Sequence[int],
        *,
        batch: int = 4,
        seq_len: int = 512,
        loss_masks: Sequence[Sequence[bool]] | None = None,
        cache_dir: str | os.PathLike | None = None,
        name: str = "train",
        store_dtype: torch.dtype = torch.float32,
        keep_in_memory: bool = False,
    ):
        if not sequences:
            raise ValueError("no sequences to capture target features from")
        self.target = target
        self.sequences = [list(s)[:seq_len] for s in sequences]
        self.masks = None if loss_masks is None else [list(m)[:seq_len] for m in loss_masks]
        self.layer_ids = sorted(layer_ids)
        self.batch = batch
        self.seq_len = seq_len
        self.store_dtype = store_dtype
        self._memory: dict[int, FeatureBatch] | None = {} if keep_in_memory else None
        self.dir: Path | None = None
        if cache_dir is not None:
            h = hashlib.sha256()
            h.update(json.dumps([str(getattr(getattr(target, "info", None), "path", "")), self.layer_ids, seq_len, batch, str(store_dtype)]).encode())
            for s in self.sequences:
                h.update(json.dumps(s).encode())
            if self.masks is not None:
                for m in self.masks:
                    h.update(bytes(bytearray(int(x) for x in m)))
            self.dir = Path(cache_dir) / f"features-{name}-{h.hexdigest()[:16]}"
            self.dir.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return math.ceil(len(self.sequences) / self.batch)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def _file(self, i: int) -> Path | None:
        return None if self.dir is None else self.dir / f"batch-{i:05d}.safetensors"

    def _compute(self, i: int) -> FeatureBatch:
        seqs = self.sequences[i * self.batch : (i + 1) * self.batch]
        masks = None if self.masks is None else self.masks[i * self.batch : (i + 1) * self.batch]
        ids, lengths, lm = pad_batch(seqs, masks, self.seq_len)
        aux, final = self.target.capture(ids, self.layer_ids, lengths)
        # streamed (neither cached nor kept): stay on the target's device, the next use is there
        dev = aux.device if self.dir is None and self._memory is None else "cpu"
        return FeatureBatch(ids, aux.to(dev, self.store_dtype), lm, final.to(dev, self.store_dtype), lengths=lengths)

    def __getitem__(self, i: int) -> FeatureBatch:
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self._memory is not None and i in self._memory:
            return self._memory[i]
        f = self._file(i)
        if f is not None and f.exists():
            fb = read_feature_file(f)
            if self._memory is not None:
                self._memory[i] = fb
            return fb
        fb = self._compute(i)
        if self._memory is not None:
            self._memory[i] = fb
        if f is not None:
            with atomic_file(f) as tmp:
                save_file({"input_ids": fb.input_ids, "lengths": fb.lengths, "loss_mask": fb.loss_mask.to(torch.uint8),
                           "aux": fb.aux.contiguous(), "final": fb.final.contiguous()}, str(tmp),
                          metadata={"layer_ids": json.dumps(self.layer_ids)})
        return fb

    def prefetch(self, progress: Progress | None = None) -> None:
        """Compute and cache every missing batch (no-op without ``cache_dir``)."""
        if self.dir is None:
            return
        for i in range(len(self)):
            f = self._file(i)
            if not f.exists():
                self[i]
            if progress:
                progress({"phase": "capture", "batch": i + 1, "batches": len(self)})


def read_feature_file(f: Path) -> FeatureBatch:
    d = load_file(str(f))
    lengths = d.get("lengths")
    return FeatureBatch(d["input_ids"].long(), d["aux"], d["loss_mask"].bool(), d.get("final"), d.get("target_logits"),
                        None if lengths is None else lengths.long())


class PrecomputedFeatures:
    """Target features another pipeline wrote, read by :mod:`eagle_migrate.hidden_states` (the one reader of a
    ``--hidden-states`` folder: the same layouts, layer-id checks and widths as the norm statistics); one
    :class:`FeatureBatch` per file (a padded batch for our own layout, one sequence for speculators / SpecForge).

    ``layer_ids`` / ``hidden_size``: the drafter's aux layers and the target's width (checked against what the
    folder records). ``final_norm=(weight, eps)``: the target's final norm, needed for speculators files, whose last
    layer is stored before it (the training target is the post-norm state). ``num_layers``: the target's L.
    ``indices``: only these files (the held-out split of :func:`split_files`), in this order.
    """

    def __init__(self, folder: str | os.PathLike, layer_ids: list[int], hidden_size: int,
                 final_norm: tuple[torch.Tensor, float] | None = None, num_layers: int | None = None,
                 indices: Sequence[int] | None = None):
        self.info = describe_hidden_states(Path(folder))
        self.layout = self.info.layout
        self.layer_ids = sorted(layer_ids)
        self.k, self.hidden_size = len(layer_ids), hidden_size
        self.num_layers = num_layers
        self.pick = self.info.pick(layer_ids)
        self.final_norm = final_norm
        self.indices = list(range(len(self.info.files))) if indices is None else list(indices)
        self.files = [self.info.files[i] for i in self.indices]
        if self.layout in ("speculators", "speculators-offline") and final_norm is None:
            raise ValueError("speculators features hold the pre-norm last layer: pass final_norm=(weight, eps)")
        self._offline = SpeculatorsOffline(self.info) if self.layout == "speculators-offline" else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> FeatureBatch:
        if not 0 <= i < len(self):
            raise IndexError(i)
        f = self.files[i]
        if self.layout == "eagle-migrate":
            fb = read_feature_file(f)
            if fb.aux.shape[-1] != self.k * self.hidden_size:
                raise DataError(f"{f}: aux hidden states are {fb.aux.shape[-1]} wide, expected K*Ht = "
                                f"{self.k}*{self.hidden_size} = {self.k * self.hidden_size}")
            return fb
        if self._offline is not None:
            last_in_aux = self.num_layers is not None and self.num_layers in self.layer_ids
            recs = [checked(self._offline.record(self.indices[i], self.k, self.hidden_size, self.final_norm, last_in_aux),
                            f, self.k, self.hidden_size)]
        else:
            recs = [checked(r, f, self.k, self.hidden_size) for r in read_file(f, self.layout, self.k, self.pick, self.final_norm)]
        r = recs[0]
        if r.last is None:
            raise DataError(f"{f}: no last-layer hidden state of width {self.hidden_size} to train against")
        t = r.input_ids.shape[0]
        lm = torch.ones(1, t, dtype=torch.bool) if r.loss_mask is None else r.loss_mask.reshape(1, -1).bool()
        return FeatureBatch(r.input_ids[None], r.aux.float()[None], lm, r.last.float()[None], lengths=torch.tensor([t]))

    @property
    def num_tokens(self) -> int:
        return sum(self[i].num_tokens for i in range(len(self)))

    def prefetch(self, progress: Progress | None = None) -> None:
        return None


def split_files(n: int, n_held: int) -> tuple[list[int], list[int]]:
    """(training file indices, held-out file indices): every ``n // n_held``-th file is held out, ``n_held`` of them
    (at least one file stays for training)."""
    n_held = max(0, min(n_held, n - 1))
    if n_held == 0:
        return list(range(n)), []
    every = max(2, n // n_held)
    held = [i for i in range(n) if i % every == every - 1][:n_held]
    return [i for i in range(n) if i not in set(held)], held


class HeldoutFromFiles:
    """A held-out suite made of precomputed files (``--hidden-states``: the target is not run, so it has no greedy
    continuations): each file's features, its prompt length (the first position of its loss mask) and the reference
    the drafts are scored against, the text's token where it is the target's greedy choice (the argmax of the
    file's last state through ``lm_head``, over the full vocabulary) and -1 elsewhere: a chain never continues past a
    position where the target would have said something else, so the simulated AL is a lower bound."""

    def __init__(self, feats: PrecomputedFeatures, lm_head: torch.Tensor, bias: torch.Tensor | None = None):
        self.feats = feats
        self.batches: list[FeatureBatch] = []
        self.prompt_lens: list[int] = []
        self.greedy_fraction = 0.0
        agree = total = 0
        for i in range(len(feats)):
            fb = feats[i]
            ids, fin = fb.input_ids[0], fb.final[0]
            top = torch.cat([_argmax_rows(fin[a : a + 128], lm_head, bias) for a in range(0, fin.shape[0], 128)])
            ref = torch.full_like(ids, -1)
            ok = ids[1:] == top[:-1]  # token p+1 is the target's greedy choice at p
            ref[1:][ok] = ids[1:][ok]
            agree += int(ok.sum())
            total += int(ok.numel())
            fb.reference = ref[None]
            self.batches.append(fb)
            lm = fb.loss_mask[0].nonzero()
            self.prompt_lens.append(max(1, int(lm[0])) if lm.numel() else 1)
        self.greedy_fraction = agree / total if total else 0.0

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> FeatureBatch:
        return self.batches[i]


def _argmax_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """argmax of ``x @ w.T (+ b)`` over the full vocabulary, computed where ``w`` lives (a loaded target's head may be
    on a GPU), returned on the CPU."""
    x = x.to(w.device)
    with torch.no_grad():
        logits = (x.to(w.dtype) @ w.T).float() if w.dtype != torch.float32 else x.float() @ w.T
        return (logits if b is None else logits + b.float()).argmax(-1).cpu()


# ----- loss ----------------------------------------------------------------------------------------------------------
