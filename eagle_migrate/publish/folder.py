"""The Hub repository folder: the checkpoint's files (copied byte for byte, or referenced in place for an upload from
a temporary folder), the validation report with local paths taken out, ``speculative_config.json``,
``provenance.json`` (the checkpoint's own plus a ``publish`` record) and ``README.md`` (the card).

Imports: ``publish.models`` / ``report`` / ``provenance`` / ``serving`` / ``card``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from .card import CardInfo, FileRow, LineageStep, ValidationInfo, render_card
from .models import (
    EXTRA_CHECKPOINT_FILES,
    PROVENANCE_FILE,
    SPEC_FILE,
    VALIDATION_DIR,
    PlannedFile,
)
from .lineage import lineage
from .provenance import Origin, public
from .report import LoadedReport, gated_verdict
from .serving import speculative_config_text


@dataclass
class RepoPlan:
    """Everything the repo folder is made from."""

    repo_id: str
    folder: Path  # the checkpoint folder
    weight_files: list[Path]
    weights_sha: str
    drafter: dict[str, Any]  # provenance.describe_checkpoint
    origin: Origin
    report: LoadedReport | None
    forced: bool
    reason: str | None  # why validation did not pass (when forced)
    k: int
    spec: dict[str, Any]  # the --speculative-config
    forced_by: str | None = None  # the flag that allowed publishing without a passing report (--force, --no-validate)

    def checkpoint_files(self) -> list[Path]:
        extra = [self.folder / n for n in EXTRA_CHECKPOINT_FILES if (self.folder / n).is_file()]
        return [self.folder / "config.json"] + self.weight_files + extra

    def not_uploaded(self) -> list[str]:
        """Checkpoint files left out on purpose (anything besides config, weights, provenance and the extras)."""
        keep = ("config.json", PROVENANCE_FILE, *EXTRA_CHECKPOINT_FILES)
        return sorted(p.name for p in self.folder.iterdir() if p.is_file() and p not in self.weight_files and p.name not in keep)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def is_previous_publish(folder: Path) -> bool:
    """Whether ``folder`` holds a repo folder publish wrote (which may then be replaced)."""
    try:
        prov = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(prov, dict) and isinstance(prov.get("publish"), dict) and (folder / SPEC_FILE).is_file()


def plan_lineage(plan: RepoPlan) -> list[LineageStep]:
    """The lineage the card and the published provenance.json show (no local path)."""
    steps = lineage(plan.origin.provenance, plan.report, plan.forced_by if plan.forced else None, plan.reason)
    return [LineageStep.model_validate(public(s.model_dump())) for s in steps]


def _card(plan: RepoPlan, files: list[PlannedFile]) -> CardInfo:
    d, o, r = plan.drafter, plan.origin, plan.report
    return CardInfo(
        repo_id=plan.repo_id, target=o.base_model, target_name=o.target_name, license=o.license,
        license_name=o.license_name, license_link=o.license_link, format=d["format"], flags=d["flags"], sizes=d["sizes"],
        aux_layer_ids=d["aux_layer_ids"], architecture=d["architecture"], num_parameters=d["num_parameters"],
        dtype=d["dtype"], quantization=d["quantization"],
        files=sorted((FileRow(path=p.path, size=p.size) for p in files), key=lambda f: f.path),
        lineage=plan_lineage(plan),
        validation=ValidationInfo.model_validate(public(r.info.model_dump())) if r else None, forced=plan.forced,
        forced_by=plan.forced_by if plan.forced else None, forced_reason=public(plan.reason) if plan.reason else None,
        num_speculative_tokens=plan.k, tool_version=__version__,
    )


def build_folder(plan: RepoPlan, dest: Path, link_weights: bool) -> list[tuple[PlannedFile, Path]]:
    """Write the generated files into ``dest``; copy (or, when ``link_weights``, reference) the checkpoint files.
    Returns each file's plan entry and where it is on disk, sorted by path in the repo."""
    planned: list[tuple[PlannedFile, Path]] = []

    def add(rel: str, src: Path, source: str, copy: bool = True) -> None:
        dst = dest / rel
        if copy:
            _copy(src, dst)
        planned.append((PlannedFile(path=rel, size=src.stat().st_size, source=source), dst if copy else src))

    def write(rel: str, text: str, source: str) -> None:
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text, encoding="utf-8")
        planned.append((PlannedFile(path=rel, size=dst.stat().st_size, source=source), dst))

    for f in plan.checkpoint_files():
        add(f.relative_to(plan.folder).as_posix(), f, "checkpoint", copy=not link_weights or f.name == "config.json")
    for f in plan.report.files if plan.report is not None else []:
        if f.suffix in (".json", ".md"):  # local paths out (public()); plots are copied as they are
            text = f.read_text(encoding="utf-8")
            if f.suffix == ".json":
                with contextlib.suppress(ValueError):
                    text = json.dumps(public(json.loads(text)), indent=2) + "\n"
            else:
                text = public(text)
            write(f"{VALIDATION_DIR}/{f.name}", text, "report")
        else:
            add(f"{VALIDATION_DIR}/{f.name}", f, "report")
    write(SPEC_FILE, speculative_config_text(plan.spec), "generated")
    prov_out = public(dict(plan.origin.provenance))  # the checkpoint's own provenance.json keeps the local paths
    prov_out["publish"] = {
        "tool": "eagle-migrate", "version": __version__, "repo_id": plan.repo_id, "base_model": plan.origin.base_model,
        "target_name": plan.origin.target_name,
        "weights_sha256": plan.weights_sha, "weight_files": [f.name for f in plan.weight_files],
        "validation": {"measured": plan.report is not None, "gates": len(plan.report.info.gates) if plan.report else 0,
                       "passed": gated_verdict(plan.report), "forced": plan.forced,
                       "forced_by": plan.forced_by if plan.forced else None,
                       "reason": public(plan.reason) if plan.reason else None},
        "num_speculative_tokens": plan.k,
        "lineage": [s.model_dump() for s in plan_lineage(plan)],
    }
    write(PROVENANCE_FILE, json.dumps(prov_out, indent=2) + "\n", "generated")
    write("README.md", render_card(_card(plan, [p for p, _ in planned])), "generated")
    planned.sort(key=lambda t: t[0].path)
    return planned
