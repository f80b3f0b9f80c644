"""Precomputed target hidden states (``--hidden-states DIR``): the one reader of such a folder, for the norm
statistics (:mod:`eagle_migrate.stats`, through ``convert``) and for the calibration fine-tune
(:class:`eagle_migrate.features.PrecomputedFeatures`), and the writer of our own layout.

Accepted layouts (aux states must be those of the drafter's ``layer_ids``, vLLM convention, ascending):

* **eagle-migrate** (ours; what ``eagle_migrate.features.FeatureStore`` caches and :func:`write_hidden_states`
  writes): ``*.safetensors`` files, each a right-padded batch with ``input_ids`` [B,T] int64, ``lengths`` [B],
  ``aux`` [B,T,K*Ht] (aux layers ascending, concatenated), optionally ``final`` [B,T,Ht] (post-final-norm last
  hidden state) or ``target_logits`` [B,T,Vd], and ``loss_mask``; header metadata ``layer_ids`` (JSON list), when
  present, must equal the drafter's ids.
* **speculators-offline** (speculators >= 0.9: ``speculators prepare-data`` then ``speculators generate-offline-data``,
  vLLM's ``extract_hidden_states`` method): ``hidden_states/hs_{i}.safetensors`` = ``hidden_states`` [T, K+1, Ht]
  (the aux layers in the order vLLM was given them, then the last layer before the final norm; bf16 as served) and
  ``token_ids`` [T], no metadata; row i of the ``datasets`` arrow folder around it (``prepare-data --output``) holds
  ``input_ids`` (must equal ``token_ids``) and ``loss_mask``. ``--hidden-states`` names the prepare-data folder or
  the ``hidden_states`` folder inside it. The layers are not recorded: slice k is the drafter's k-th aux id
  (ascending) and the last slice is layer L (docs/formats.md, section 'Precomputed hidden states'); the last slice is
  checked by evidence (:func:`check_last_slice`). Read with safetensors file by file and the dataset through
  ``datasets`` (the ``offline`` extra).
* **speculators** (``scripts/data_generation_offline.py``, before 0.9): ``data_N.pt`` = ``{"input_ids": [T], "hidden_states":
  [[T, Ht] per captured layer], "loss_mask": [T]}`` with the layer list in ``data_config.json``; speculators
  captures the aux layers and then the last layer (pre-norm). When ``data_config.json`` records layer ids they must
  contain the drafter's, which are picked by id; otherwise the first K are the aux states. The entry after them is
  the last layer: normalised with the target's final norm (``final_norm``) it is the ``last`` state.
* **SpecForge** offline data (``scripts/prepare_hidden_states.py``): ``**/*.ckpt`` = ``{"input_ids": [T],
  "loss_mask": [T], "aux_hidden_state": [1, T, K*Ht], "hidden_state": [1, T, Ht]}`` (post-norm); SpecForge records
  no layer ids (its defaults are the same tensors as vLLM's): only the width K*Ht is checked.

``.pt`` / ``.ckpt`` files are read with ``torch.load(weights_only=True)`` (tensors, lists and dicts only; never code).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .errors import DataError
from .formats.io import torch_load_weights_only


@dataclass
class HiddenRecord:
    """One sequence: token ids [T], aux states [T, K*Ht] at the drafter's aux layers, optional post-norm last
    [T, Ht] and loss mask [T]."""

    input_ids: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None


@dataclass
class HiddenStatesFolder:
    """A ``--hidden-states`` folder: its layout, files and recorded layer ids (:func:`describe_hidden_states`)."""

    path: Path
    layout: str  # eagle-migrate | speculators-offline | speculators | specforge
    files: list[Path]
    layer_ids: list[int] | None
    has_last: bool
    dataset: Path | None = None  # speculators-offline: the prepare-data arrow folder (row i <-> hs_i)

    def pick(self, layer_ids: list[int]) -> list[int] | None:
        """Indices of ``layer_ids`` in a speculators capture list (None: the first K), after checking that the
        folder holds the drafter's layers; raises DataError when it does not."""
        want = sorted(layer_ids)
        rec = self.layer_ids
        if rec is None:
            return None
        if self.layout == "eagle-migrate" and sorted(rec) != want:
            raise DataError(f"{self.path}: hidden states were captured at layers {rec}, the drafter needs {want}")
        if self.layout == "speculators":
            if not set(want) <= set(rec):
                raise DataError(f"{self.path}: speculators data captured layers {rec}, the drafter needs {want}")
            return [rec.index(i) for i in want]
        return None


def write_hidden_states(out: Path, records: list[HiddenRecord] | Iterator[HiddenRecord], layer_ids: list[int], batch: int = 1) -> Path:
    """Write records in our own feature layout (the one ``eagle_migrate.features.FeatureStore`` caches): one
    ``batch-NNNNN.safetensors`` per ``batch`` sequences, right-padded, with ``input_ids`` [B,T] int64, ``lengths``
    [B], ``loss_mask`` [B,T] uint8, ``aux`` [B,T,K*Ht], ``final`` [B,T,Ht] when known, metadata ``layer_ids``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    buf: list[HiddenRecord] = []
    n = 0

    def flush() -> None:
        nonlocal n
        if not buf:
            return
        t = max(r.input_ids.numel() for r in buf)
        b = len(buf)
        d = buf[0].aux.shape[-1]
        ids = torch.zeros(b, t, dtype=torch.int64)
        aux = torch.zeros(b, t, d, dtype=buf[0].aux.dtype)
        lm = torch.zeros(b, t, dtype=torch.uint8)
        lengths = torch.tensor([r.input_ids.numel() for r in buf], dtype=torch.int64)
        has_final = all(r.last is not None for r in buf)
        final = torch.zeros(b, t, buf[0].last.shape[-1], dtype=buf[0].last.dtype) if has_final else None
        for i, r in enumerate(buf):
            L = r.input_ids.numel()
            ids[i, :L] = r.input_ids.reshape(-1)
            aux[i, :L] = r.aux.reshape(L, -1)
            lm[i, :L] = 1 if r.loss_mask is None else r.loss_mask.reshape(-1).to(torch.uint8)
            if final is not None:
                final[i, :L] = r.last.reshape(L, -1)
        tensors = {"input_ids": ids, "lengths": lengths, "loss_mask": lm, "aux": aux}
        if final is not None:
            tensors["final"] = final
        save_file(tensors, str(out / f"batch-{n:05d}.safetensors"), metadata={"layer_ids": json.dumps(sorted(layer_ids))})
        n += 1
        buf.clear()

    for rec in records:
        buf.append(rec)
        if len(buf) >= batch:
            flush()
    flush()
    return out


def _find_layer_ids(obj: Any) -> list[int] | None:
    if isinstance(obj, dict):
        for key in ("layer_ids", "aux_layer_ids", "eagle_aux_hidden_state_layer_ids"):
            v = obj.get(key)
            if isinstance(v, list) and v and all(isinstance(i, int) for i in v):
                return v
        for v in obj.values():
            r = _find_layer_ids(v)
            if r is not None:
                return r
    return None


def _torch_load(path: Path) -> Any:
    try:
        return torch_load_weights_only(path, mmap=True)
    except RuntimeError:
        try:
            return torch_load_weights_only(path)
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{path}: not a readable hidden-states file ({str(e)[:160]})") from None
    except Exception as e:  # noqa: BLE001  (UnpicklingError for anything beyond tensors/lists/dicts)
        raise DataError(f"{path}: not a readable hidden-states file ({str(e)[:160]})") from None


def _st_header(f: Path) -> tuple[set[str], dict[str, str]]:
    with safe_open(str(f), framework="pt") as sf:
        return set(sf.keys()), dict(sf.metadata() or {})


def _is_arrow_dataset(p: Path) -> bool:
    """A folder ``datasets``' ``save_to_disk`` wrote (``dataset_info.json`` + ``state.json``)."""
    return (p / "dataset_info.json").is_file() and (p / "state.json").is_file()


def _hs_index(f: Path) -> int | None:
    try:
        return int(f.name[len("hs_"):-len(".safetensors")])
    except ValueError:
        return None


def _speculators_offline(path: Path) -> HiddenStatesFolder | None:
    """speculators >= 0.9 offline data at ``path`` (the prepare-data folder or its ``hidden_states``), else None.
    The hs_i files must be hs_0 .. hs_{n-1} without a hole, with a dataset row for each."""
    if any(path.glob("hs_*.safetensors")):
        hs, ds = path, path.parent if _is_arrow_dataset(path.parent) else (path if _is_arrow_dataset(path) else None)
    elif (path / "hidden_states").is_dir() and any((path / "hidden_states").glob("hs_*.safetensors")):
        hs, ds = path / "hidden_states", path if _is_arrow_dataset(path) else None
    else:
        return None
    idx = sorted(i for i in (_hs_index(f) for f in hs.glob("hs_*.safetensors")) if i is not None)
    if not idx:
        return None
    if ds is None:
        raise DataError(f"{hs / f'hs_{idx[0]}.safetensors'}: speculators offline hidden states without their prepare-data "
                        f"dataset (no dataset_info.json + state.json in {hs.parent} or {hs})",
                        "pass the `speculators prepare-data --output` folder that holds hidden_states/")
    missing = sorted(set(range(idx[-1] + 1)) - set(idx))
    if missing:
        raise DataError(f"{hs / f'hs_{missing[0]}.safetensors'}: missing ({len(missing)} of hs_0 .. hs_{idx[-1]} absent; "
                        "speculators generate-offline-data skips a sample whose request failed)",
                        "re-run `speculators generate-offline-data` on the same folder (it fills the holes)")
    return HiddenStatesFolder(path, "speculators-offline", [hs / f"hs_{i}.safetensors" for i in idx], None, True, ds)


def describe_hidden_states(path: Path) -> HiddenStatesFolder:
    """Which layout a hidden-states folder is in, its files and (when recorded) its layer ids."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: --hidden-states must be a folder")
    off = _speculators_offline(path)
    if off is not None:
        return off
    st = sorted(path.glob("*.safetensors"))
    if st:
        keys, meta = _st_header(st[0])
        if "aux" not in keys or "input_ids" not in keys:
            raise DataError(f"{st[0]}: not an eagle-migrate feature file (needs 'input_ids' and 'aux')")
        ids = None
        if meta.get("layer_ids"):
            try:
                ids = json.loads(meta["layer_ids"])
            except json.JSONDecodeError:
                ids = None
        return HiddenStatesFolder(path, "eagle-migrate", st, ids, "final" in keys)
    spec = sorted(path.glob("data_*.pt"), key=lambda p: (len(p.name), p.name))
    if spec:
        ids = None
        cfg = path / "data_config.json"
        if cfg.is_file():
            try:
                ids = _find_layer_ids(json.loads(cfg.read_text()))
            except json.JSONDecodeError:
                ids = None
        return HiddenStatesFolder(path, "speculators", spec, ids, True)
    sf = sorted(path.rglob("*.ckpt"))
    if sf:
        return HiddenStatesFolder(path, "specforge", sf, None, True)
    raise DataError(f"{path}: no hidden states found (expected eagle-migrate *.safetensors feature files, speculators "
                    "hidden_states/hs_*.safetensors or data_*.pt, or SpecForge *.ckpt)",
                    "see docs/norm-init.md, section 'Precomputed hidden states'")


def _norm(x: torch.Tensor, final_norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    w, eps = final_norm
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float().to(xf.device)


class SpeculatorsOffline:
    """The reader of one speculators >= 0.9 offline folder: its prepare-data dataset opened once through ``datasets``
    (memory-mapped arrow: only the rows asked for are read) and the ``hs_i`` files read one at a time. Every check
    names the file: unreadable / truncated, keys, [T, S, H] against the drafter's K (+1 for the last layer) and the
    target's width, ``token_ids`` against row i's ``input_ids``, finite values."""

    KEYS = ("hidden_states", "token_ids")

    def __init__(self, info: HiddenStatesFolder):
        self.info = info
        try:
            import datasets  # lazy: datasets is optional (speculators' offline folders only)
        except ImportError:
            raise DataError(f"{info.dataset}: reading speculators' prepare-data dataset needs the `datasets` library",
                            "pip install 'eagle-migrate[offline]'") from None
        try:
            ds = datasets.load_from_disk(str(info.dataset))
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{info.dataset}: not a readable `datasets` folder ({str(e)[:160]})") from None
        cols = set(getattr(ds, "column_names", []) or [])
        if not {"input_ids", "loss_mask"} <= cols:
            raise DataError(f"{info.dataset}: the prepare-data dataset lacks {sorted({'input_ids', 'loss_mask'} - cols)} "
                            f"(columns: {sorted(cols)})")
        if len(ds) < len(info.files):
            raise DataError(f"{info.files[len(ds)]}: no row {len(ds)} for it in the prepare-data dataset {info.dataset} "
                            f"({len(ds)} rows)", "the hidden states belong to another prepare-data run")
        self.ds = ds.select_columns(["input_ids", "loss_mask"])

    def raw(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden_states [T, S, H] as stored, input_ids [T], loss_mask [T]) of file i, checked but not sliced."""
        f = self.info.files[i]
        try:
            with safe_open(str(f), framework="pt") as sf:
                keys = set(sf.keys())
                if not set(self.KEYS) <= keys:
                    raise DataError(f"{f}: not a speculators hidden-states file (needs 'hidden_states' and 'token_ids'; "
                                    f"has {sorted(keys)})")
                hs, tok = sf.get_tensor("hidden_states"), sf.get_tensor("token_ids")
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001  (safetensors' header / size checks: a truncated file)
            raise DataError(f"{f}: not a readable safetensors file ({str(e)[:160]})",
                            "a truncated file: re-run `speculators generate-offline-data` (it regenerates unreadable files)") from None
        if hs.dim() != 3:
            raise DataError(f"{f}: 'hidden_states' is {list(hs.shape)}, expected [T, K+1, H]")
        row = self.ds[i]
        ids = torch.as_tensor(row["input_ids"], dtype=torch.int64).reshape(-1)
        tok = tok.reshape(-1).to(torch.int64)
        if tok.shape != ids.shape or not torch.equal(tok, ids):
            n = min(tok.numel(), ids.numel())
            diff = (tok[:n] != ids[:n]).nonzero()
            at = int(diff[0]) if diff.numel() else n
            raise DataError(f"{f}: token_ids disagree with row {i} of the prepare-data dataset {self.info.dataset} "
                            f"({tok.numel()} vs {ids.numel()} tokens, first difference at position {at})",
                            "the hidden states were generated from another prepare-data run: regenerate them for this dataset")
        if hs.shape[0] != ids.numel():
            raise DataError(f"{f}: {hs.shape[0]} hidden-state rows for {ids.numel()} token ids")
        bad = ~torch.isfinite(hs)
        if bool(bad.any()):
            t0, s0, _ = (int(x) for x in bad.nonzero()[0])
            raise DataError(f"{f}: hidden states hold NaN/Inf ({int(bad.sum())} values; the first at token {t0}, slice {s0})",
                            "regenerate this file (speculators generate-offline-data --validate-outputs refuses such files)")
        lm = torch.as_tensor(row["loss_mask"]).reshape(-1)
        if lm.numel() != ids.numel():
            raise DataError(f"{f}: row {i}'s loss_mask has {lm.numel()} entries for {ids.numel()} tokens")
        return hs, ids, lm

    def record(self, i: int, k: int, hidden_size: int, final_norm: tuple[torch.Tensor, float] | None,
               last_in_aux: bool) -> HiddenRecord:
        """File i as a record: aux = slices 0..K-1 (the drafter's aux ids ascending), ``last`` = the last slice (layer
        L, before the final norm) through ``final_norm``. ``last_in_aux``: the drafter's aux ids include L, which
        speculators then does not append again (K slices, the last one both)."""
        hs, ids, lm = self.raw(i)
        f = self.info.files[i]
        t, s, h = hs.shape
        need = k if last_in_aux else k + 1
        if h != hidden_size:
            raise DataError(f"{f}: hidden states are {h} wide, the target's hidden_size is {hidden_size}")
        if s != need:
            raise DataError(f"{f}: {s} layer slices [T, {s}, H], but the drafter's {k} aux layers"
                            f"{'' if last_in_aux else ' plus the last layer'} need {need}",
                            "capture with the drafter's aux ids (speculators launch_vllm.py --target-layer-ids, last layer included)")
        aux = hs[:, :k].reshape(t, k * h)
        last = _norm(hs[:, -1], final_norm) if final_norm is not None else None
        return HiddenRecord(ids, aux, last, lm)


@dataclass
class LastSliceEvidence:
    """The logit lens of every slice of one file: next-token top-1 accuracy through the target's final norm and
    lm_head. The last slice must be layer L: the one that predicts the text best (docs/formats.md)."""

    file: str
    positions: int
    accuracy: list[float]  # per slice, in file order

    @property
    def ok(self) -> bool:
        return self.accuracy[-1] >= max(self.accuracy) - 1e-9 and self.accuracy[-1] > 0.0

    def describe(self) -> str:
        acc = ", ".join(f"{a:.3f}" for a in self.accuracy)
        return (f"last slice verified as the target's last layer: next-token top-1 through the final norm and lm_head "
                f"{self.accuracy[-1]:.3f} on {self.positions} positions of {Path(self.file).name} (slices: {acc})")


def _lens_accuracy(x: torch.Tensor, nxt: torch.Tensor, lm_head: torch.Tensor) -> float:
    """Next-token top-1 accuracy of post-norm states ``x`` [n, H] through ``lm_head`` [V, H]."""
    hits = 0
    for a in range(0, x.shape[0], 128):
        xa = x[a : a + 128]
        logits = xa.float() @ lm_head.T if lm_head.dtype == torch.float32 else (xa.to(lm_head.dtype) @ lm_head.T).float()
        hits += int((logits.argmax(-1) == nxt[a : a + 128]).sum())
    return hits / max(1, x.shape[0])


def check_last_slice(path: Path, final_norm: tuple[torch.Tensor, float], lm_head: torch.Tensor,
                     max_positions: int = 512) -> LastSliceEvidence | None:
    """For folders that do not record their layers (speculators-offline; SpecForge) the logit lens of every stored
    state of the first file: speculators' slices through the final norm, SpecForge's aux chunks through it and its
    ``hidden_state`` (already post-norm) as stored. Raises DataError when the last state is not the one that predicts
    the next tokens best (then it is not the target's last layer, or another target wrote the states). None for the
    other layouts (eagle-migrate's records its layer ids; speculators' data_N.pt its data_config.json)."""
    info = describe_hidden_states(Path(path))
    if info.layout == "speculators-offline":
        hs, ids, _ = SpeculatorsOffline(info).raw(0)
        slices = [hs[:, s] for s in range(hs.shape[1])]
        normed = [True] * len(slices)
    elif info.layout == "specforge":
        d = _torch_load(info.files[0])
        if not isinstance(d, dict) or "aux_hidden_state" not in d or "hidden_state" not in d or "input_ids" not in d:
            return None
        ids = torch.as_tensor(d["input_ids"]).reshape(-1)
        h = lm_head.shape[-1]
        aux = d["aux_hidden_state"].reshape(ids.numel(), -1)
        if aux.shape[-1] % h:
            raise DataError(f"{info.files[0]}: aux_hidden_state is {aux.shape[-1]} wide, not a multiple of the target's {h}")
        slices = [aux[:, i * h : (i + 1) * h] for i in range(aux.shape[-1] // h)] + [d["hidden_state"].reshape(ids.numel(), -1)]
        normed = [True] * (len(slices) - 1) + [False]
    else:
        return None
    f = info.files[0]
    n = min(ids.numel() - 1, max_positions)
    if n < 1:
        return None
    if slices[0].shape[-1] != lm_head.shape[-1]:
        raise DataError(f"{f}: hidden states are {slices[0].shape[-1]} wide, the target's lm_head takes {lm_head.shape[-1]}")
    nxt = ids[1 : n + 1].to(torch.int64)
    acc = [_lens_accuracy(_norm(x[:n], final_norm) if nrm else x[:n].float(), nxt, lm_head) for x, nrm in zip(slices, normed, strict=True)]
    ev = LastSliceEvidence(str(f), n, acc)
    if not ev.ok:
        raise DataError(f"{f}: the last slice is not the target's last layer (next-token top-1 through the final "
                        f"norm and lm_head per slice: {', '.join(f'{a:.3f}' for a in acc)}; the last must be the best)",
                        "the states were captured from another target or with another layer order")
    return ev


def read_file(f: Path, layout: str, k: int, pick: list[int] | None,
              final_norm: tuple[torch.Tensor, float] | None = None) -> Iterator[HiddenRecord]:
    """The records of one file (a batch for our layout, one sequence otherwise), unvalidated. ``last`` of a
    speculators file is its pre-norm last layer normalised with ``final_norm`` (None without it)."""
    if layout == "eagle-migrate":
        d = load_file(str(f))
        ids, aux, fin, lm = d["input_ids"], d["aux"], d.get("final"), d.get("loss_mask")
        if ids.dim() == 1:
            yield HiddenRecord(ids, aux, fin, lm)
            return
        lengths = d.get("lengths")
        for b in range(ids.shape[0]):
            n = int(lengths[b]) if lengths is not None else ids.shape[1]
            yield HiddenRecord(ids[b, :n], aux[b, :n], None if fin is None else fin[b, :n], None if lm is None else lm[b, :n])
    elif layout == "speculators":
        d = _torch_load(f)
        hs = d.get("hidden_states") if isinstance(d, dict) else None
        if not isinstance(hs, (list, tuple)) or len(hs) < k:
            raise DataError(f"{f}: expected 'hidden_states' as a list of >= {k} tensors")
        idx = pick if pick is not None else list(range(k))
        chosen = [hs[i] for i in idx]
        t = chosen[0].shape[-2]
        last = None
        if final_norm is not None and len(hs) > k and (len(hs) - 1) not in idx:
            last = _norm(hs[-1].reshape(t, -1), final_norm)
        yield HiddenRecord(d["input_ids"], torch.cat([h.reshape(t, -1) for h in chosen], dim=-1), last, d.get("loss_mask"))
    else:
        d = _torch_load(f)
        if not isinstance(d, dict) or "aux_hidden_state" not in d or "input_ids" not in d:
            raise DataError(f"{f}: expected a SpecForge record with 'input_ids' and 'aux_hidden_state'")
        yield HiddenRecord(d["input_ids"], d["aux_hidden_state"], d.get("hidden_state"), d.get("loss_mask"))


def checked(rec: HiddenRecord, f: Path, k: int, hidden_size: int) -> HiddenRecord:
    """``rec`` with 1-D ids, 2-D states, after checking the widths and lengths agree."""
    ids = torch.as_tensor(rec.input_ids).reshape(-1).to(torch.int64)
    aux = rec.aux.reshape(-1, rec.aux.shape[-1])
    if aux.shape[-1] != k * hidden_size:
        raise DataError(f"{f}: aux hidden states are {aux.shape[-1]} wide, expected K*Ht = {k}*{hidden_size} = {k * hidden_size}")
    if aux.shape[0] != ids.shape[0]:
        raise DataError(f"{f}: {ids.shape[0]} token ids but {aux.shape[0]} hidden-state rows")
    last = rec.last
    if last is not None:
        last = last.reshape(-1, last.shape[-1])
        if last.shape[-1] != hidden_size or last.shape[0] != ids.shape[0]:
            last = None
    lm = None if rec.loss_mask is None else rec.loss_mask.reshape(-1)
    if lm is not None and lm.shape[0] != ids.shape[0]:
        lm = None
    return HiddenRecord(ids, aux, last, lm)


def iter_hidden_states(path: Path, layer_ids: list[int], hidden_size: int, limit: int | None = None,
                       final_norm: tuple[torch.Tensor, float] | None = None,
                       num_layers: int | None = None) -> Iterator[HiddenRecord]:
    """Stream precomputed target hidden states, one sequence at a time (layouts: the module docstring).
    ``final_norm``: the target's final norm ``(weight, eps)``, which turns a speculators file's pre-norm last layer
    into the post-norm ``last`` state. ``num_layers``: the target's L (speculators-offline: whether an aux id is L)."""
    info = describe_hidden_states(path)
    k = len(layer_ids)
    if info.layout == "speculators-offline":
        rd = SpeculatorsOffline(info)
        last_in_aux = num_layers is not None and num_layers in layer_ids
        for i, f in enumerate(info.files):
            if limit is not None and i >= limit:
                return
            yield checked(rd.record(i, k, hidden_size, final_norm, last_in_aux), f, k, hidden_size)
        return
    pick = info.pick(layer_ids)
    n = 0
    for f in info.files:
        for rec in read_file(f, info.layout, k, pick, final_norm):
            if limit is not None and n >= limit:
                return
            yield checked(rec, f, k, hidden_size)
            n += 1


def count_hidden_states(path: Path) -> int:
    """How many sequences a hidden-states folder holds (reads headers only where possible)."""
    info = describe_hidden_states(path)
    if info.layout != "eagle-migrate":
        return len(info.files)

    n = 0
    for f in info.files:
        with safe_open(str(f), framework="pt") as sf:
            shape = sf.get_slice("input_ids").get_shape()
        n += 1 if len(shape) == 1 else shape[0]
    return n
