"""What the stages produce on every fixture, as one JSON document: run it before and after a refactor and diff.

    PYTHONPATH=$PWD .venv/bin/python scripts/behaviour_snapshot.py OUT.json [--quick]

Covered (issue 39's "byte-identical" check): ``inspect`` reports (with and without the target) of every producer
fixture (tests/fixtures/producers) and of every layout our tests write (tests/layouts.py); ``convert
--no-calibrate`` of every producer fixture on its toy target (sha256 of every weight file; config.json and
provenance.json as JSON); ``quantize`` (fp8-dynamic, fp8, nvfp4a16, nvfp4) of a converted toy oracle; a short
calibration (``--train norms``, 4 steps) of the toy oracle; ``validate`` with the reference engine on the toy pair
(report.json). Volatile values are dropped (seconds, timestamps, the command line, the run's temporary folder is
written as ``<ROOT>``), so two runs of the same code give the same document. ``--quick``: producer fixtures only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOLATILE = re.compile(r"(seconds|_at$|^elapsed|wall|timestamp|^command$|^date$|duration|^created|cpu_s|tokens_per_s|"
                      r"^eta|rss|peak_mem|^time$|^started|^finished|versions?$|^host|^python$)")


def _norm(x: Any, root: str) -> Any:
    if isinstance(x, dict):
        return {k: _norm(v, root) for k, v in sorted(x.items()) if not VOLATILE.search(str(k))}
    if isinstance(x, list):
        return [_norm(v, root) for v in x]
    if isinstance(x, str):
        x = re.sub(r"\.tmp-\d+-[0-9a-f]+", ".tmp", x.replace(root, "<ROOT>"))
        return re.sub(r"(?m)^- created: .*$", "- created: <TIME>", x)  # report.md's creation line
    if isinstance(x, float):
        return round(x, 9)
    return x


def _folder(p: Path, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(p.rglob("*")):
        if not f.is_file():
            continue
        rel = str(f.relative_to(p))
        if f.suffix == ".json":
            out[rel] = _norm(json.loads(f.read_text()), root)
        elif f.suffix == ".md":
            out[rel] = _norm(f.read_text(), root)
        elif f.suffix != ".png":
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _targets(d: Path) -> dict[str, Path]:
    from eagle_migrate import toy

    return {"t6": toy.write_target(d / "t6"), "t8": toy.write_target(d / "t8", layers=8),
            "q6": toy.write_target(d / "q6", family="qwen3")}


def _fixture_target(fixture: Path) -> str:
    line = next(x for x in (fixture / "README.md").read_text().splitlines() if x.startswith("Target:"))
    return "q6" if "qwen3" in line else "t8" if "layers=8" in line else "t6"


def _cli(*args: str) -> tuple[int, Any]:
    """One eagle-migrate command (the CLI is the contract a refactor keeps): (exit code, its --json document)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", *args, "--json"], capture_output=True, text=True,
                       env=env, timeout=1800)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}


def snapshot(quick: bool) -> dict[str, Any]:
    from eagle_migrate import toy

    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="em-snapshot-") as tmp:
        d = Path(tmp)
        root = str(d)
        targets = _targets(d)

        def run(key: str, *args: str, folder: Path | None = None) -> None:
            rc, out = _cli(*args)
            doc[key] = {"exit": rc, "json": _norm(out, root)}
            if folder is not None and folder.is_dir():
                doc[key]["files"] = _folder(folder, root)

        fixtures = sorted(p for p in (ROOT / "tests" / "fixtures" / "producers").iterdir() if (p / "README.md").is_file())
        for f in fixtures:
            t = str(targets[_fixture_target(f)])
            run(f"inspect/{f.name}", "inspect", str(f))
            run(f"inspect-target/{f.name}", "inspect", str(f), "--target", t)
            out = d / "conv" / f.name
            run(f"convert/{f.name}", "convert", str(f), "--target", t, "-o", str(out), "--no-calibrate",
                "--num-sequences", "8", folder=out)
        if quick:
            return doc
        from tests.layouts import LAYOUT_NAMES, canonical_state_dict, write_layout

        cfg = toy.drafter_config(fc_norm=True, norm_output=True)
        for name in LAYOUT_NAMES:
            p = write_layout(name, cfg, canonical_state_dict(cfg), d / "layouts" / name)
            run(f"layout-inspect/{name}", "inspect", str(p))
        src = toy.write_drafter(d / "oracle", "oracle")
        t6 = str(targets["t6"])
        conv = d / "oracle-31"
        run("convert/oracle", "convert", str(src), "--target", t6, "-o", str(conv), "--no-calibrate",
            "--num-sequences", "8", folder=conv)
        for scheme in ("fp8-dynamic", "fp8", "nvfp4a16", "nvfp4"):
            q = d / f"q-{scheme}"
            run(f"quantize/{scheme}", "quantize", str(conv), "-o", str(q), "--scheme", scheme, "--target", t6,
                "--validate", "none", "--num-calibration-sequences", "8", folder=q)
        cal = d / "oracle-cal"
        run("convert-calibrated/oracle", "convert", str(src), "--target", t6, "-o", str(cal), "--train", "norms",
            "--steps", "4", "--num-sequences", "8", folder=cal)
        rep = d / "report"
        run("validate/reference", "validate", str(conv), "--target", t6, "--engine", "reference", "--suite", "chat",
            "--num-prompts", "4", "--max-tokens", "16", "--baseline", str(src), "--report", str(rep), folder=rep)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    doc = snapshot(a.quick)
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    print(f"{len(doc)} entries -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
