"""``publish``: build a Hub repository folder for a drafter and upload it in one commit through huggingface_hub.

The folder holds the checkpoint's ``config.json`` and safetensors weights (copied byte for byte), ``README.md``
(model card: ``card.py``), ``speculative_config.json`` (the dict ``vllm serve --speculative-config`` takes),
``provenance.json`` (the checkpoint's own provenance plus a ``publish`` record with the weights' sha256), and under
``validation/`` the validation report (``report.json``, ``report.md``, plots).

* A checkpoint is published only with a passing validation report (``report.json``: an explicit ``passed: true``
  or gates that all passed) unless ``force``; a report that names other weights (``drafter_sha256`` /
  ``checkpoint_sha256`` / ``weights_sha256`` differing from ``formats.io.sha256_files`` of the weights) is refused.
* ``dry_run`` writes the folder and returns the plan: no network at all.
* Upload: ``create_repo(exist_ok=True, private=...)``, ``create_branch(revision, exist_ok=True)`` when a revision is
  given, then ONE ``create_commit`` (PR when ``create_pr``; against ``revision`` when given). The token comes from
  the ``token`` argument or huggingface_hub's own resolution (``HF_TOKEN``, then the stored login); it is never
  printed, logged, written, or left in an exception message (every error text is scrubbed).
* The input checkpoint is only read.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import __version__
from .card import TARGET_PLACEHOLDER, CardInfo, FileRow, GateRow, ValidationInfo, render_card, sglang_args, vllm_serve_command
from .errors import CheckFailed, CheckpointError, EagleMigrateError, HubError, InputError, OutputExistsError, redact
from .formats.base import Finding
from .formats import Checkpoint, read_checkpoint
from .formats.io import atomic_output_dir, open_checkpoint_path, read_json, sha256_files
from .formats.vllm import speculative_config

REPORT_FILE = "report.json"
SPEC_FILE = "speculative_config.json"
PROVENANCE_FILE = "provenance.json"
VALIDATION_DIR = "validation"
EXTRA_CHECKPOINT_FILES = ("model.safetensors.index.json", "generation_config.json", "recipe.yaml")
MAX_PLOTS = 8
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA_KEYS = ("drafter_sha256", "checkpoint_sha256", "weights_sha256")


# ----- results ---------------------------------------------------------------------------------------------------
class PlannedFile(BaseModel):
    path: str = Field(..., description="path inside the repository")
    size: int
    source: Literal["checkpoint", "generated", "report"]


class ValidationStatus(BaseModel):
    report: str | None = Field(None, description="the report.json that was read")
    passed: bool | None = None
    forced: bool = Field(False, description="published with --force without a passing report")
    reason: str | None = Field(None, description="why the report does not pass (when it does not)")


class PublishResult(BaseModel):
    """What ``publish`` did (or, with ``dry_run``, would do)."""

    model_config = ConfigDict(frozen=True)

    repo_id: str
    dry_run: bool
    private: bool
    create_pr: bool
    revision: str | None
    commit_message: str
    out_dir: str | None = Field(None, description="the repo folder on disk (None: a temporary folder, removed)")
    files: list[PlannedFile]
    total_bytes: int
    not_uploaded: list[str] = Field(default_factory=list, description="checkpoint files left out on purpose")
    base_model: str | None
    license: str | None
    format: str
    num_speculative_tokens: int
    speculative_config: dict[str, Any]
    vllm_serve: str
    sglang_args: list[str]
    validation: ValidationStatus
    findings: list[Finding] = Field(default_factory=list)
    repo_url: str | None = None
    commit_url: str | None = None
    commit_oid: str | None = None
    pr_url: str | None = None


# ----- reading inputs defensively --------------------------------------------------------------------------------
class ReportView(BaseModel):
    """report.json as written by ``validate`` (read defensively: unknown keys kept, shapes checked on use)."""

    model_config = ConfigDict(extra="allow")

    passed: bool | None = None
    ok: bool | None = None
    status: str | None = None
    gates: Any = None
    suites: Any = None
    results: Any = None
    num_speculative_tokens: int | None = None
    engine: str | None = None
    target: Any = None
    temperature: float | None = None
    vllm_version: str | None = None


class ProvenanceView(BaseModel):
    """provenance.json written next to a converted / quantized checkpoint (read defensively)."""

    model_config = ConfigDict(extra="allow")

    license: Any = None
    license_name: str | None = None
    license_link: str | None = None


_TARGET_KEYS = ("target", "base_model", "verifier")


def _prov_targets(prov: dict[str, Any]) -> list[Any]:
    """Values naming the target in provenance.json: top-level keys first (convert writes ``target``), then one
    level down (quantize writes ``options.target``)."""
    out = [prov[k] for k in _TARGET_KEYS if k in prov]
    for v in prov.values():
        if isinstance(v, dict):
            out += [v[k] for k in _TARGET_KEYS if k in v]
    return out


def _scalar_str(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _passed_of(d: Any) -> bool | None:
    if isinstance(d, bool):
        return d
    if not isinstance(d, dict):
        return None
    for k in ("passed", "ok", "pass"):
        if isinstance(d.get(k), bool):
            return d[k]
    st = d.get("status") or d.get("result")
    if isinstance(st, str):
        return st.lower() in ("pass", "passed", "ok", "success")
    return None


def _gates(raw: Any) -> list[GateRow]:
    items: list[tuple[str, Any]] = []
    if isinstance(raw, list):
        items = [(str((g or {}).get("name") or (g or {}).get("gate") or f"gate {i + 1}") if isinstance(g, dict) else f"gate {i + 1}", g)
                 for i, g in enumerate(raw)]
    elif isinstance(raw, dict):
        items = [(str(k), v) for k, v in raw.items()]
    rows = []
    for name, g in items:
        detail = None
        if isinstance(g, dict):
            parts = []
            for key in ("message", "detail", "reason"):
                if isinstance(g.get(key), str):
                    parts.append(g[key])
                    break
            else:
                for key in ("value", "threshold", "min", "max"):
                    if key in g and isinstance(g[key], (int, float, str)) and not isinstance(g[key], bool):
                        parts.append(f"{key} {_scalar_str(g[key])}")
            detail = "; ".join(parts) or None
        rows.append(GateRow(name=name, passed=_passed_of(g), detail=detail))
    return rows


_DROP_KEYS = {"outputs", "drafts", "accepted_per_position", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
              "num_output_tokens", "seconds", "prompts"}
_PRETTY = {"acceptance_length": "AL", "draft_acceptance_rate": "acceptance rate", "per_position_rate": "per-position rate",
           "num_prompts": "prompts", "baseline_acceptance_length": "baseline AL"}


def _flatten_row(d: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if k in _DROP_KEYS:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth == 0:
            out.update(_flatten_row(v, key + ".", 1))
        elif isinstance(v, list) and 0 < len(v) <= 16 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[key] = " / ".join(_scalar_str(float(x)) if isinstance(x, float) else str(x) for x in v)
        elif v is None or isinstance(v, (str, int, float, bool)):
            out[key] = "" if v is None else _scalar_str(v)
    return out


def _pretty_col(c: str) -> str:
    parts = c.split(".")
    return " ".join(_PRETTY.get(p, p.replace("_", " ")) for p in parts)


def _suite_table(raw: Any, max_cols: int = 8) -> tuple[list[str], list[list[str]]]:
    if isinstance(raw, dict):
        entries = [(str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    elif isinstance(raw, list):
        entries = [(str(v.get("suite") or v.get("name") or i + 1), v) for i, v in enumerate(raw) if isinstance(v, dict)]
    else:
        return [], []
    flat = [(name, _flatten_row({k: x for k, x in v.items() if k not in ("suite", "name")})) for name, v in entries]
    cols: list[str] = []
    for _, f in flat:
        cols += [c for c in f if c not in cols]

    def rank(c: str) -> int:
        lc = c.lower()
        if "acceptance_length" in lc and "baseline" not in lc and "source" not in lc:
            return 0
        if "acceptance_length" in lc:
            return 1
        if any(w in lc for w in ("delta", "change", "regression", "ratio")):
            return 2
        if "passed" in lc or lc == "ok":
            return 3
        if "rate" in lc:
            return 4
        return 5

    cols = sorted(cols, key=lambda c: (rank(c), cols.index(c)))[: max_cols - 1]
    return ["suite"] + [_pretty_col(c) for c in cols], [[name] + [f.get(c, "") for c in cols] for name, f in flat]


def _hub_id(v: Any) -> str | None:
    """A hub model id from a provenance value (string, or a dict naming it); local paths are not hub ids."""
    if isinstance(v, dict):
        for k in ("repo_id", "hub_id", "id", "name_or_path", "name", "path"):
            if isinstance(v.get(k), str):
                got = _hub_id(v[k])
                if got:
                    return got
        return None
    if isinstance(v, list) and v:
        return _hub_id(v[0])
    if not isinstance(v, str) or not _REPO_ID.match(v):
        return None
    with contextlib.suppress(OSError):
        if Path(v).exists():
            return None
    return v


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


def scrub(text: str, token: str | None) -> str:
    """Remove a token, anything shaped like a Hub token and credentials in URLs from a message."""
    return redact(text, token)


# ----- the pieces ------------------------------------------------------------------------------------------------
class _Report(BaseModel):
    path: Path
    raw: dict[str, Any]
    model: ReportView
    passed: bool | None
    reason: str | None
    info: ValidationInfo
    files: list[Path]  # report.json, report.md, plots


def load_report(report_dir: Path) -> _Report:
    report_dir = Path(report_dir)
    path = report_dir / REPORT_FILE if report_dir.is_dir() else report_dir
    if not path.is_file():
        raise InputError(f"{report_dir}: no {REPORT_FILE}", "pass the folder given to `eagle-migrate validate --report DIR`")
    try:
        raw = read_json(path, "validation report")
    except CheckpointError as e:
        raise InputError(e.message, "re-run `eagle-migrate validate ... --report DIR`") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(raw).__name__}", "re-run `eagle-migrate validate ... --report DIR`")
    try:
        model = ReportView.model_validate(raw)
    except ValidationError as e:
        raise InputError(f"{path}: unexpected report layout ({e.errors()[0]['loc']}: {e.errors()[0]['msg']})",
                         "re-run `eagle-migrate validate ... --report DIR`") from None
    gates = _gates(model.gates)
    explicit = next((x for x in (model.passed, model.ok) if x is not None), None)
    if explicit is None and model.status:
        explicit = model.status.lower() in ("pass", "passed", "ok", "success")
    failing = [g.name for g in gates if g.passed is False]
    unknown = [g.name for g in gates if g.passed is None]
    if explicit is False:
        passed, reason = False, "the report says it did not pass" + (f" (gates: {', '.join(failing)})" if failing else "")
    elif failing:
        passed, reason = False, f"gates failed: {', '.join(failing)}"
    elif explicit is True:
        passed, reason = True, None
    elif gates and not unknown:
        passed, reason = True, None
    else:
        passed, reason = None, "the report records no verdict (no `passed` and no gate results)"
    cols, rows = _suite_table(model.suites if model.suites is not None else model.results)
    details: list[tuple[str, str]] = []
    if model.engine:
        details.append(("engine", model.engine + (f" {model.vllm_version}" if model.vllm_version else "")))
    if model.num_speculative_tokens:
        details.append(("k", str(model.num_speculative_tokens)))
    if model.temperature is not None:
        details.append(("temperature", f"{model.temperature:g}"))
    folder = path.parent
    plots = sorted(p for p in folder.glob("*.png") if p.is_file())[:MAX_PLOTS]
    md = folder / "report.md"
    files = [path] + ([md] if md.is_file() else []) + plots
    info = ValidationInfo(
        passed=passed, gates=gates, columns=cols, rows=rows, details=details,
        images=[f"{VALIDATION_DIR}/{p.name}" for p in plots], report_path=f"{VALIDATION_DIR}/{REPORT_FILE}",
    )
    return _Report(path=path, raw=raw, model=model, passed=passed, reason=reason, info=info, files=files)


def _report_sha(raw: dict[str, Any]) -> str | None:
    for d in (raw, raw.get("drafter") if isinstance(raw.get("drafter"), dict) else {}, raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}):
        for k in _SHA_KEYS + ("sha256",):
            if isinstance(d.get(k), str) and len(d[k]) == 64:
                return d[k].lower()
    return None


def _describe_checkpoint(ck: Checkpoint) -> dict[str, Any]:
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
        "sizes": {"hidden_size": c.hidden_size, "target_hidden_size": c.target_hidden_size, "vocab_size": c.vocab_size,
                  "draft_vocab_size": c.draft_vocab_size, "intermediate_size": c.intermediate_size,
                  "num_hidden_layers": c.num_layers},
        "num_parameters": ck.num_parameters,
        "dtype": max(dtypes, key=dtypes.get) if dtypes else None,
        "quantization": quant,
    }


_ABS_PATH = re.compile(r"(?<![\w:/.~-])(?:~|[A-Za-z]:)?/(?:[^\s/\"'`|]+/)*[^\s/\"'`|]*")
_HF_CACHE_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/")


def _public_path(p: str) -> str:
    """A local path as it may leave the machine: the hub id of an HF cache snapshot, else ``<local>/NAME``."""
    m = _HF_CACHE_SNAPSHOT.search(p)
    if m:
        return f"{m.group('org')}/{m.group('name')}"
    name = Path(p.rstrip("/")).name
    return f"<local>/{name}" if name else "<local>"


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
    if _hub_id(v) is not None:
        return v
    with contextlib.suppress(OSError, ValueError):
        if not v.startswith(("/", "~")) and ("/" in v or "\\" in v) and Path(v).exists():
            return _public_path(v)
    return _ABS_PATH.sub(lambda m: _public_path(m.group(0)) if len(m.group(0)) > 1 else m.group(0), v)


def _provenance_rows(prov: dict[str, Any], limit: int = 24) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []

    def add(key: str, v: Any) -> None:
        if len(rows) >= limit:
            return
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if not isinstance(v2, (dict, list)):
                    add(f"{key}.{k2}", v2)
        elif isinstance(v, list):
            if v and all(isinstance(x, (str, int, float)) for x in v) and len(v) <= 8:
                rows.append((key, ", ".join(str(x) for x in v)))
        elif v is not None and (s := _scalar_str(v)):
            rows.append((key, s if len(s) <= 120 else s[:117] + "..."))

    for k, v in prov.items():
        if k != "publish":
            add(k, v)
    return rows


def _license_from_target_dir(p: Path | None) -> tuple[str | None, str | None, str | None]:
    if p is None or not (p / "README.md").is_file():
        return None, None, None
    from huggingface_hub.repocard import metadata_load

    try:
        meta = metadata_load(p / "README.md") or {}
    except Exception:  # a malformed card: the license is simply unknown
        return None, None, None
    lic = meta.get("license")
    return (lic if isinstance(lic, str) else None, meta.get("license_name"), meta.get("license_link"))


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


@contextlib.contextmanager
def _quiet_hub_progress(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was = are_progress_bars_disabled()
    if not enabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not was and not enabled:
            enable_progress_bars()


def _is_previous_publish(folder: Path) -> bool:
    try:
        prov = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(prov, dict) and isinstance(prov.get("publish"), dict) and (folder / SPEC_FILE).is_file()


# ----- the command -----------------------------------------------------------------------------------------------
def publish(
    checkpoint: Path,
    repo_id: str,
    *,
    report_dir: Path | None = None,
    private: bool = False,
    create_pr: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    out_dir: Path | None = None,
    token: str | None = None,
    progress: Callable[[str], None] | None = None,
    target: str | None = None,
    license: str | None = None,
    num_speculative_tokens: int | None = None,
) -> PublishResult:
    """Build the repo folder for ``checkpoint`` and (unless ``dry_run``) upload it to ``repo_id`` in one commit.

    ``out_dir``: where to write the folder (replaced when it holds an earlier publish folder); default
    ``./<name>-publish`` with ``dry_run``, else a temporary folder (weights are then uploaded from the checkpoint
    in place). ``target`` / ``license`` override what provenance.json and config.json say; ``num_speculative_tokens``
    defaults to the report's k, else 3. ``force`` publishes without a passing validation report.
    """
    say = progress or (lambda msg: None)
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id):
        raise InputError(f"--repo-id {repo_id!r} is not ORG/NAME", "e.g. --repo-id my-org/llama31-8b-eagle3.1")
    if revision is not None and (not revision.strip() or revision.startswith("refs/pr/")):
        raise InputError(f"--revision {revision!r} is not a branch name", "pass a branch (created if missing), or --create-pr")
    ckpt = Path(checkpoint)
    folder, weight_files, cfg = open_checkpoint_path(ckpt)
    folder = folder.resolve()
    if ckpt.is_file():
        raise InputError(f"{ckpt}: publish takes the checkpoint folder (config.json + weights)", "pass the folder")
    if cfg is None:
        raise CheckpointError(f"{folder}: no config.json; vLLM cannot load a drafter without it", "publish the output of `eagle-migrate convert`")
    bad = [f.name for f in weight_files if f.suffix != ".safetensors"]
    if bad:
        raise CheckpointError(f"{folder}: {', '.join(bad)} are not safetensors; only safetensors weights are published",
                              "run `eagle-migrate convert` first: it writes safetensors")
    ck = read_checkpoint(folder)
    if ck.config.generation != "eagle3" or not ck.config.supported_architecture:
        raise CheckpointError(f"{folder}: a {ck.format} drafter ({ck.config.architecture}); publish takes EAGLE-3 / EAGLE-3.1 drafters",
                              "run `eagle-migrate convert` first")
    desc = _describe_checkpoint(ck)
    findings: list[Finding] = list(ck.findings)
    errors = [f.message for f in ck.findings if f.severity == "error"]
    weights_sha = sha256_files(weight_files)

    # -- validation gate
    report = load_report(report_dir) if report_dir is not None else None
    reason = None
    if errors:
        reason = f"`eagle-migrate inspect` finds errors: {'; '.join(errors[:3])}"
    elif report is None:
        reason = "no validation report (--report DIR)"
    elif report.passed is not True:
        reason = report.reason
    else:
        rsha = _report_sha(report.raw)
        if rsha is None:
            findings.append(Finding(severity="warning", code="report_without_weights_sha256",
                                    message=f"{report.path} does not record the sha256 of the weights it measured "
                                            "(eagle-migrate validate writes weights_sha256): it is trusted as given"))
        elif rsha != weights_sha:
            reason = f"{report.path} was made for other weights (sha256 {rsha[:12]}…, these are {weights_sha[:12]}…)"
    if reason is not None and not force:
        if report is None and not errors:
            raise InputError(f"refusing to publish {folder}: {reason}",
                             "run `eagle-migrate validate CKPT --target T --report DIR` and pass --report DIR (or --force to publish unvalidated)")
        raise CheckFailed(f"refusing to publish {folder}: {reason}",
                          "fix the drafter or the thresholds and re-validate; --force publishes anyway (the card says so)")
    forced = reason is not None
    if forced:
        findings.append(Finding(severity="warning", code="published_with_force", message=f"published with --force: {reason}"))

    # -- provenance, target, license, k
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
    if target is not None and _hub_id(target) is None:
        raise InputError(f"--target {target!r} is not a hub model id (ORG/NAME)", "base_model must name a model on the Hub")
    candidates = [target, *_prov_targets(prov_raw), (spec_cfg.get("verifier") or {}),
                  (cfg.get("eagle_migrate") or {}).get("target") if isinstance(cfg.get("eagle_migrate"), dict) else None,
                  report.model.target if report else None]
    base_model = next((h for h in (_hub_id(c) for c in candidates) if h), None)
    if base_model is None:
        findings.append(Finding(severity="warning", code="base_model_unknown",
                                message="the target's hub id is unknown (not in provenance.json or config.json): the card has no base_model; pass --target ORG/NAME"))
    lic, lic_name, lic_link = (license, None, None)
    if lic is None and isinstance(prov.license, str):
        lic, lic_name, lic_link = prov.license, prov.license_name, prov.license_link
    if lic is None:
        local = next((d for d in (_local_dir(c) for c in candidates[1:]) if d), None)
        lic, lic_name, lic_link = _license_from_target_dir(local)
    if lic is None:
        findings.append(Finding(severity="info", code="license_unknown",
                                message="no license in provenance.json or the target's card: pass --license (the target's license usually applies)"))
    k = num_speculative_tokens or (report.model.num_speculative_tokens if report else None) or 3
    spec = speculative_config(repo_id, k)

    name = repo_id.split("/")[1]
    kind = "EAGLE-3.1" if desc["format"] == "eagle3.1" else "EAGLE-3"
    commit_message = f"Upload {kind} drafter" + (f" for {base_model}" if base_model else "") + f" (eagle-migrate {__version__})"
    description = (
        f"Made and published with eagle-migrate {__version__}. Weights sha256 {weights_sha}. "
        + ("Validation: passed." if not forced else f"Validation: NOT passed, published with --force ({reason}).")
    )

    # -- build the folder
    def build(dest: Path, link_weights: bool) -> list[tuple[PlannedFile, Path]]:
        """Write generated files into ``dest``; copy (or, when ``link_weights``, reference) the checkpoint files."""
        planned: list[tuple[PlannedFile, Path]] = []

        def add(rel: str, src: Path, source: str, copy: bool = True) -> None:
            dst = dest / rel
            if copy:
                _copy(src, dst)
            planned.append((PlannedFile(path=rel, size=src.stat().st_size, source=source), dst if copy else src))

        for f in [folder / "config.json"] + weight_files + [folder / n for n in EXTRA_CHECKPOINT_FILES if (folder / n).is_file()]:
            add(f.relative_to(folder).as_posix(), f, "checkpoint", copy=not link_weights or f.name == "config.json")
        if report is not None:
            for f in report.files:
                if f.suffix in (".json", ".md"):  # local paths out (public()); plots are copied as they are
                    (dest / VALIDATION_DIR).mkdir(parents=True, exist_ok=True)
                    text = f.read_text(encoding="utf-8")
                    if f.suffix == ".json":
                        with contextlib.suppress(ValueError):
                            text = json.dumps(public(json.loads(text)), indent=2) + "\n"
                    else:
                        text = public(text)
                    (dest / VALIDATION_DIR / f.name).write_text(text, encoding="utf-8")
                    planned.append((PlannedFile(path=f"{VALIDATION_DIR}/{f.name}", size=(dest / VALIDATION_DIR / f.name).stat().st_size,
                                                source="report"), dest / VALIDATION_DIR / f.name))
                else:
                    add(f"{VALIDATION_DIR}/{f.name}", f, "report")
        (dest / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        planned.append((PlannedFile(path=SPEC_FILE, size=(dest / SPEC_FILE).stat().st_size, source="generated"), dest / SPEC_FILE))
        prov_out = public(dict(prov_raw))  # the checkpoint's own provenance.json keeps the local paths
        prov_out["publish"] = {
            "tool": "eagle-migrate", "version": __version__, "repo_id": repo_id, "base_model": base_model,
            "weights_sha256": weights_sha, "weight_files": [f.name for f in weight_files],
            "validation": {"passed": report.passed if report else None, "forced": forced, "reason": reason},
            "num_speculative_tokens": k,
        }
        (dest / PROVENANCE_FILE).write_text(json.dumps(prov_out, indent=2) + "\n", encoding="utf-8")
        planned.append((PlannedFile(path=PROVENANCE_FILE, size=(dest / PROVENANCE_FILE).stat().st_size, source="generated"), dest / PROVENANCE_FILE))
        info = CardInfo(
            repo_id=repo_id, target=base_model, license=lic, license_name=lic_name, license_link=lic_link,
            format=desc["format"], flags=desc["flags"], sizes=desc["sizes"], aux_layer_ids=desc["aux_layer_ids"],
            architecture=desc["architecture"], num_parameters=desc["num_parameters"], dtype=desc["dtype"],
            quantization=desc["quantization"], files=sorted((FileRow(path=p.path, size=p.size) for p, _ in planned), key=lambda f: f.path),
            provenance=_provenance_rows(public(prov_raw)), validation=ValidationInfo.model_validate(public(report.info.model_dump())) if report else None, forced=forced,
            num_speculative_tokens=k, tool_version=__version__,
        )
        (dest / "README.md").write_text(render_card(info), encoding="utf-8")
        planned.append((PlannedFile(path="README.md", size=(dest / "README.md").stat().st_size, source="generated"), dest / "README.md"))
        planned.sort(key=lambda t: t[0].path)
        return planned

    not_uploaded = sorted(
        p.name for p in folder.iterdir()
        if p.is_file() and p not in weight_files and p.name not in ("config.json", PROVENANCE_FILE, *EXTRA_CHECKPOINT_FILES)
    )
    tmp_ctx: contextlib.AbstractContextManager[Any]
    if out_dir is None and dry_run:
        out_dir = Path(f"{name}-publish")
    if out_dir is not None:
        out = Path(out_dir)
        if out.exists() and not _is_previous_publish(out):
            raise OutputExistsError(f"{out} exists and is not an earlier publish folder", "choose another --out, or delete it")
        say(f"writing the repo folder {out}")
        with atomic_output_dir(out, force=True, inputs=[folder] + ([report.path.parent] if report else [])) as tmp:
            planned_tmp = build(tmp, link_weights=False)
        planned = [(p, out / p.path) for p, _ in planned_tmp]
        tmp_ctx = contextlib.nullcontext()
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="eagle-migrate-publish-")
    common = dict(
        repo_id=repo_id, private=private, create_pr=create_pr, revision=revision, commit_message=commit_message,
        base_model=base_model, license=lic, format=desc["format"], num_speculative_tokens=k, speculative_config=spec,
        vllm_serve=vllm_serve_command(base_model or TARGET_PLACEHOLDER, spec),
        sglang_args=sglang_args(repo_id, k), findings=findings, not_uploaded=not_uploaded,
        validation=ValidationStatus(report=str(report.path) if report else None, passed=report.passed if report else None, forced=forced, reason=reason),
    )
    if dry_run:
        return PublishResult(dry_run=True, out_dir=str(out_dir), files=[p for p, _ in planned],
                             total_bytes=sum(p.size for p, _ in planned), **common)

    with tmp_ctx as tmpdir:
        if tmpdir is not None:
            planned = build(Path(tmpdir), link_weights=True)
        commit = _upload(planned, repo_id, private=private, create_pr=create_pr, revision=revision,
                         commit_message=commit_message, description=description, token=token, say=say,
                         show_bars=progress is not None)
    return PublishResult(dry_run=False, out_dir=str(out_dir) if out_dir is not None else None,
                         files=[p for p, _ in planned], total_bytes=sum(p.size for p, _ in planned), **commit, **common)


def _resolve_token(token: str | None) -> str:
    if token:
        return token
    import huggingface_hub

    try:
        got = huggingface_hub.get_token()
    except Exception as e:  # e.g. an OIDC exchange that failed: say why, without any secret
        raise InputError(f"could not get a Hugging Face token: {scrub(str(e).splitlines()[0] if str(e) else e.__class__.__name__, None)}",
                         "set HF_TOKEN (a write token) or run `hf auth login`") from None
    if not got:
        raise InputError("no Hugging Face token: HF_TOKEN is not set and there is no stored login",
                         "set HF_TOKEN to a token with write access, or run `hf auth login`; --dry-run needs none")
    return got


def _hub_error(e: Exception, token: str, what: str) -> EagleMigrateError:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    first = str(e).strip().splitlines()
    msg = scrub(" ".join(x.strip() for x in first[:3] if x.strip())[:300] or e.__class__.__name__, token)
    if isinstance(e, RevisionNotFoundError):
        return InputError(f"{what}: revision not found ({msg})", "check --revision")
    if isinstance(e, RepositoryNotFoundError):
        return InputError(f"{what}: repository not found or not writable ({msg})", "check --repo-id and that the token can write to it")
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            return InputError(f"{what}: the Hub refused the token (HTTP {status})", "use a token with write access to the organisation (HF_TOKEN or `hf auth login`)")
        if status is not None and 400 <= status < 500:
            return InputError(f"{what}: the Hub rejected the request (HTTP {status}): {msg}")
        return HubError(f"{what}: the Hub answered HTTP {status}: {msg}")
    if isinstance(e, ValueError):
        return InputError(f"{what}: {msg}")
    from huggingface_hub import constants

    where = scrub(str(constants.ENDPOINT), token)  # the endpoint is named; credentials in it never are
    return HubError(f"{what} at {where}: {e.__class__.__name__}: {msg}", "check the network (HF_ENDPOINT if you use a mirror) and re-run")


def _upload(planned: list[tuple[PlannedFile, Path]], repo_id: str, *, private: bool, create_pr: bool, revision: str | None,
            commit_message: str, description: str, token: str | None, say: Callable[[str], None],
            show_bars: bool) -> dict[str, Any]:
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    if constants.is_offline_mode():
        raise InputError("HF_HUB_OFFLINE is set: publishing needs the network", "unset HF_HUB_OFFLINE, or use --dry-run")
    tok = _resolve_token(token)
    api = HfApi(token=tok)
    total = sum(p.size for p, _ in planned)
    with _quiet_hub_progress(enabled=show_bars):
        try:
            say(f"creating {repo_id} on {api.endpoint} if needed")
            repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
        except Exception as e:
            raise _hub_error(e, tok, f"create_repo {repo_id}") from None
        if revision is not None and revision != "main":
            try:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            except Exception as e:
                raise _hub_error(e, tok, f"create_branch {revision}") from None
        ops = [CommitOperationAdd(path_in_repo=p.path, path_or_fileobj=str(src)) for p, src in planned]
        say(f"uploading {len(ops)} files ({total / 1e6:.1f} MB) in one commit" + (" as a pull request" if create_pr else ""))
        try:
            info = api.create_commit(repo_id, ops, commit_message=commit_message, commit_description=description,
                                     revision=revision, create_pr=create_pr)
        except Exception as e:
            raise _hub_error(e, tok, f"commit to {repo_id}") from None
    return {"repo_url": str(repo_url), "commit_url": info.commit_url, "commit_oid": info.oid, "pr_url": info.pr_url}
