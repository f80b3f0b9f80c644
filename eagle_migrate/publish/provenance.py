"""What the repo says about where a drafter came from: the checkpoint's own provenance.json (read defensively), the
target's hub id (``base_model``) and license found in it, the card's drafter facts from the project's reader, and
:func:`public`, what of a local value may leave the machine.

Imports: pydantic, huggingface_hub (lazily), ``errors``, ``fingerprints`` (target_name),
``formats`` (Checkpoint, io, Finding), ``publish.models``,
``publish.card`` (cell text).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import CheckpointError, InputError, redact
from ..formats import Checkpoint
from ..formats.base import Finding
from ..fingerprints import target_name
from ..formats.io import read_json
from .card import scalar_str
from .models import PROVENANCE_FILE, REPO_ID

_TARGET_KEYS = ("target_hub_id", "target", "base_model", "verifier")
# an absolute path: at the start or after a space, quote, backtick, bracket, `=` or `,` (not "+/-" or "a/b")
_ABS_PATH = re.compile(r"(?<![^\s\"'`(\[=,])(?:~|[A-Za-z]:)?/(?:[^\s/\"'`|]+/)*[^\s/\"'`|]*")
_CODE_SPAN = re.compile(r"`([^`\s]+)`")
_HF_CACHE_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/")
# a relative path through a stage's temporary folder (``OUT/.quantize.tmp-PID-HEX/model``): gone once the stage ended
_TMP_PATH = re.compile(r"(?<![\w/.-])(?:[\w.-]+/)*\.[\w-]+\.(?:tmp|old)-[\w-]+(?:/[\w.-]+)*")
_PARENT_KEY = "parent"  # quantize's provenance.json keeps its source's whole record here


class ProvenanceView(BaseModel):
    """provenance.json written next to a converted / quantized checkpoint (read defensively)."""

    model_config = ConfigDict(extra="allow")

    license: Any = None
    license_name: str | None = None
    license_link: str | None = None


def chain(prov: dict[str, Any]) -> list[dict[str, Any]]:
    """The provenance records of every stage, newest first: the checkpoint's own, then its ``parent`` (quantize
    keeps convert's record there), and so on."""
    out: list[dict[str, Any]] = []
    node: Any = prov
    while isinstance(node, dict) and node and len(out) < 16:
        out.append(node)
        node = node.get(_PARENT_KEY)
    return out


def _prov_targets(prov: dict[str, Any]) -> list[Any]:
    """Values naming the target in provenance.json, stage by stage (newest first): top-level keys first (convert
    writes ``target_hub_id`` / ``target``), then one level down (quantize writes ``options.target``)."""
    def keys(d: dict[str, Any]) -> list[Any]:
        if "target_name" in d or "target_hub_id" in d:  # a record that names its target: its raw spec may be a path
            return [d.get("target_hub_id")]
        return [d[k] for k in _TARGET_KEYS if k in d]

    out: list[Any] = []
    for node in chain(prov):
        out += keys(node)
        for k, v in node.items():
            if isinstance(v, dict) and k != _PARENT_KEY:
                out += keys(v)
    return out


def _prov_target_names(prov: dict[str, Any]) -> list[str]:
    """The target's name without a path (``target_name``, written by convert and quantize), newest stage first."""
    out: list[str] = []
    for node in chain(prov):
        for d in [node, *(v for k, v in node.items() if isinstance(v, dict) and k != _PARENT_KEY)]:
            if isinstance(d.get("target_name"), str) and d["target_name"]:
                out.append(d["target_name"])
    return out


def hub_id(v: Any) -> str | None:
    """A hub model id from a provenance value (string, or a dict naming it); local paths are not hub ids."""
    if isinstance(v, dict):
        for k in ("repo_id", "hub_id", "id", "name_or_path", "name", "path"):
            if isinstance(v.get(k), str):
                got = hub_id(v[k])
                if got:
                    return got
        return None
    if isinstance(v, list) and v:
        return hub_id(v[0])
    if not isinstance(v, str) or not REPO_ID.match(v):
        return None
    with contextlib.suppress(OSError):
        if Path(v).exists():
            return None
    return v


def _exists(v: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return Path(v).expanduser().exists()
    return False


def _local_dir(v: Any) -> Path | None:
    if isinstance(v, dict):
        for k in ("path", "name_or_path", "local_path"):
            if isinstance(v.get(k), str):
                return _local_dir(v[k])
        return None
    if isinstance(v, str):
        with contextlib.suppress(OSError):
            p = Path(v)
            if p.is_dir():
                return p
    return None


# ----- what may leave the machine ------------------------------------------------------------------------------------
def scrub(text: str, token: str | None) -> str:
    """Remove a token, anything shaped like a Hub token and credentials in URLs from a message."""
    return redact(text, token)


def _public_path(p: str) -> str:
    """A local path as it may leave the machine: the hub id of an HF cache snapshot, else ``<local>/NAME`` (NAME:
    the last part that is not a stage's temporary folder)."""
    m = _HF_CACHE_SNAPSHOT.search(p)
    if m:
        return f"{m.group('org')}/{m.group('name')}"
    parts = [x for x in Path(p.rstrip("/")).parts if x not in ("/", "~") and not _TMP_PATH.fullmatch(x)]
    return f"<local>/{parts[-1]}" if parts else "<local>"


def public(v: Any, key: str = "") -> Any:
    """What of a provenance / report value may be uploaded: no local absolute path (a hub id or ``<local>/NAME``
    instead), no full command line (only the subcommand), no credentials. Local paths stay in the local files."""
    if isinstance(v, dict):
        return {k: public(x, str(k)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(public(x, key) for x in v)
    if not isinstance(v, str):
        return v
    if key == "command":
        return " ".join(v.split()[:2])  # "eagle-migrate convert": the options carried paths
    v = redact(v)
    if hub_id(v) is not None:
        return v
    with contextlib.suppress(OSError, ValueError):
        if not v.startswith(("/", "~")) and ("/" in v or "\\" in v) and Path(v).exists():
            return _public_path(v)
    v = _TMP_PATH.sub(lambda m: _public_path(m.group(0)), v)
    v = _CODE_SPAN.sub(lambda m: f"`{_public_path(m.group(1))}`" if _is_local_relative(m.group(1)) else m.group(0), v)
    return _ABS_PATH.sub(lambda m: _public_path(m.group(0)) if len(m.group(0)) > 1 else m.group(0), v)


def _is_local_relative(v: str) -> bool:
    """A relative path (with a folder part) that exists here, e.g. ``out/quantize/model`` in a report's Markdown."""
    with contextlib.suppress(OSError, ValueError):
        return not v.startswith(("/", "~")) and "/" in v.strip("/") and Path(v).exists()
    return False


# ----- the drafter, its target and license ---------------------------------------------------------------------------
def describe_checkpoint(ck: Checkpoint) -> dict[str, Any]:
    """What the card shows about the drafter, from the project's own reader (``formats.read_checkpoint``)."""
    c = ck.config
    archs = (ck.raw_config or {}).get("architectures")
    dtypes: dict[str, int] = {}
    for info in ck.store.infos.values():
        dtypes[info.dtype] = dtypes.get(info.dtype, 0) + info.numel
    q = ck.quantization
    quant = None
    if q:
        quant = str(q.get("quant_method") or "quantized") + (f" ({q['scheme']})" if q.get("scheme") else "")
    return {
        "architecture": archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        "flags": {f: bool(getattr(c, f)) for f in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual")},
        "format": c.format_name,
        "aux_layer_ids": sorted(c.aux_layer_ids) if c.aux_layer_ids is not None else None,
        # carried verbatim (as vLLM reads them) when nothing decided their convention (docs/formats.md section 4)
        "aux_ids_convention": (ck.aux.convention or "undecided") if ck.aux is not None and ck.aux.stored is not None else None,
        "sizes": {"hidden_size": c.hidden_size, "target_hidden_size": c.target_hidden_size, "vocab_size": c.vocab_size,
                  "draft_vocab_size": c.draft_vocab_size, "intermediate_size": c.intermediate_size,
                  "num_hidden_layers": c.num_layers},
        "num_parameters": ck.num_parameters,
        "dtype": max(dtypes, key=dtypes.get) if dtypes else None,
        "quantization": quant,
    }


def _license_from_target_dir(p: Path | None) -> tuple[str | None, str | None, str | None]:
    if p is None or not (p / "README.md").is_file():
        return None, None, None
    from huggingface_hub.repocard import metadata_load  # lazy: huggingface_hub (0.2 s), only to read a card

    try:
        meta = metadata_load(p / "README.md") or {}
    except Exception:  # a malformed card: the license is simply unknown
        return None, None, None
    lic = meta.get("license")
    return (lic if isinstance(lic, str) else None, meta.get("license_name"), meta.get("license_link"))


@dataclass
class Origin:
    """Where a drafter came from, as the repo states it."""

    provenance: dict[str, Any]  # the checkpoint's own provenance.json ({} when there is none), local paths kept
    base_model: str | None
    license: str | None
    license_name: str | None
    license_link: str | None
    target_name: str | None = None  # a local target's own name when its hub id is unknown (never its path)


def resolve_origin(folder: Path, cfg: dict[str, Any], report_target: Any, target: str | None, license: str | None,
                   findings: list[Finding]) -> Origin:
    """The provenance, the target's hub id and the license: ``target`` / ``license`` when given, else what
    provenance.json, config.json and the report say (the license also from a local target's card). What is unknown
    or unreadable is added to ``findings``."""
    prov_path = folder / PROVENANCE_FILE
    prov_raw: dict[str, Any] = {}
    if prov_path.is_file():
        try:
            got = read_json(prov_path, PROVENANCE_FILE)
            prov_raw = got if isinstance(got, dict) else {}
        except CheckpointError as e:
            findings.append(Finding(severity="warning", code="provenance_unreadable", message=e.message))
    prov = ProvenanceView.model_validate(prov_raw)
    spec_cfg = cfg.get("speculators_config") if isinstance(cfg.get("speculators_config"), dict) else {}
    given = None
    if target is not None:
        given = target_name(target) if hub_id(target) is None and _exists(target) else None  # a folder or a .gguf
        if hub_id(target) is None and given is None:
            raise InputError(f"--target {target!r} is neither a hub model id (ORG/NAME) nor a local model",
                             "base_model must name a model on the Hub")
    candidates = [given.hub_id if given else target, *_prov_targets(prov_raw), (spec_cfg.get("verifier") or {}),
                  (cfg.get("eagle_migrate") or {}).get("target") if isinstance(cfg.get("eagle_migrate"), dict) else None,
                  report_target]
    base_model = next((h for h in (hub_id(c) for c in candidates) if h), None)
    name = None
    if base_model is None:  # a local target: its own name (the folder's config), never its path
        local_names = [given.name] if given else []
        local_names += _prov_target_names(prov_raw)
        for c in candidates[1:]:
            d = _local_dir(c)
            tn = target_name(str(d)) if d is not None else None
            if tn is not None:
                if tn.hub_id:
                    base_model = tn.hub_id
                    break
                local_names.append(tn.name)
        name = None if base_model else next(iter(local_names), None)
    if base_model is None:
        findings.append(Finding(severity="warning", code="base_model_unknown",
                                message="the target's hub id is unknown (not in provenance.json or config.json): the card has "
                                        "no base_model" + (f" and names the local model `{name}`" if name else "")
                                        + "; pass --target ORG/NAME"))
    lic, lic_name, lic_link = (license, None, None)
    if lic is None and isinstance(prov.license, str):
        lic, lic_name, lic_link = prov.license, prov.license_name, prov.license_link
    if lic is None:
        local = (_local_dir(target) or _local_dir(str(Path(target).expanduser().parent))) if given else next((d for d in (_local_dir(c) for c in candidates[1:]) if d), None)
        lic, lic_name, lic_link = _license_from_target_dir(local)
    if lic is None:
        findings.append(Finding(severity="info", code="license_unknown",
                                message="no license in provenance.json or the target's card: pass --license (the target's license usually applies)"))
    return Origin(prov_raw, base_model, lic, lic_name, lic_link, name)
