"""``read_checkpoint(path)``: open any drafter checkpoint we know, decide its layout, parse it into a Checkpoint.

Detection (docs/formats.md):
1. open the path safely (headers only for safetensors; ``.bin`` via ``torch.load(weights_only=True)``), read
   config.json (optional), ``hf_quant_config.json`` and the safetensors header metadata;
2. canonicalise the tensor names (strip ``model.`` when every non-``lm_head`` name has it, ``midlayer.`` ->
   ``layers.0.``);
3. the generation comes from the weights (layer-0 attention input 2H -> EAGLE-3, H -> EAGLE-1/2);
4. every registered layout scores the probe; the best score wins (config fingerprints such as
   ``speculators_model_type``, ``_torchspec_version`` or ModelOpt's ``eagle_config.use_*`` keys score highest,
   then name style + file type + architecture); nothing matching -> an ``unknown`` producer read generically.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from ..errors import CheckpointError
# the readers register their layouts; import order = tie-break order
from . import speculators, torchspec, modelopt, specforge, safeailab, vllm_read  # noqa: F401
from .base import LAYOUTS, Checkpoint, Layout, Probe
from .common import derive, hf_view, quant_scheme, scan_names
from .io import TensorStore, open_checkpoint_path, read_json


def probe_checkpoint(path: Path | str) -> Probe:
    """Open ``path`` and gather what detection needs; reads no tensor data from safetensors files."""
    path = Path(path)
    if path.name == "config.json" or path.name.endswith(".index.json"):
        try:
            if path.is_file():  # a file that names its folder: read the folder
                path = path.parent
        except OSError:
            pass
    folder, files, cfg = open_checkpoint_path(path)
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: is a {'folder' if f.is_dir() else 'special file'}, not a weights file")
    store = TensorStore(folder, files)
    scan = scan_names(store)
    st_meta: dict[str, str] = {}
    sts = [f for f in files if f.suffix == ".safetensors"]
    if sts:
        try:
            with safe_open(str(sts[0]), framework="numpy") as sf:  # the header only ("pt" imports torch)
                st_meta = dict(sf.metadata() or {})
        except Exception:
            st_meta = {}
    side = {}
    hq = folder / "hf_quant_config.json"
    if hq.is_file():
        data = read_json(hq, "hf_quant_config.json")
        if not isinstance(data, dict):
            raise CheckpointError(f"{hq}: expected a JSON object, found {type(data).__name__}")
        side["hf_quant_config.json"] = data
    return Probe(path=path, folder=folder, files=files, config=cfg, store=store, scan=scan, st_metadata=st_meta, side=side)


def detect_layout(probe: Probe) -> tuple[Layout | None, dict[str, int]]:
    """The best-scoring layout (None when none matches) and every layout's score."""
    scores = {name: int(lay.sniff(probe)) for name, lay in LAYOUTS.items()}
    best = max(scores.values(), default=0)
    if best <= 0:
        return None, scores
    name = next(n for n, s in scores.items() if s == best)
    return LAYOUTS[name], scores


def _read_unknown(p: Probe) -> Checkpoint:
    return derive(p.folder, p.store, p.scan, hf_view(p.config), producer="unknown", layout="unknown",
                  raw_config=p.config, quantization=quant_scheme(p.config, p.side.get("hf_quant_config.json")))


def read_checkpoint(path: Path | str) -> Checkpoint:
    """Read any supported drafter checkpoint (folder or single weights file) into a lazy ``Checkpoint``.

    Raises CheckpointError (exit 2) for anything unreadable, unsafe or self-contradicting; problems that still
    leave a well-defined drafter are ``Checkpoint.findings``.
    """
    probe = probe_checkpoint(path)
    layout, scores = detect_layout(probe)
    try:
        ck = layout.read(probe) if layout is not None else _read_unknown(probe)
    except CheckpointError as e:
        if not e.message.startswith(str(probe.folder)):
            e.message = f"{probe.folder}: {e.message}"
            e.args = (e.message,)
        raise
    ck.meta.setdefault("layout_scores", {k: v for k, v in scores.items() if v})
    root = probe.folder.resolve()
    ck.meta.setdefault("files", [str(f.relative_to(root)) if f.is_relative_to(root) else str(f) for f in probe.files])
    ck.meta.setdefault("st_metadata", probe.st_metadata)
    return ck
