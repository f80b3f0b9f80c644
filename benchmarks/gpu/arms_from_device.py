"""Here, after ``warm_start_gpu.py`` ran on a lent GPU: its returned tensors as drafter folders vLLM serves.

    python benchmarks/gpu/arms_from_device.py --returned DIR --out runs/ws-gpu --source plain=DIR --source best=DIR \
        [--target PATH] [--steps best,last,25,...]

For each ``ARM.safetensors`` in ``--returned`` (``SOURCE-KIND``, see warm_start_gpu.py) the arm's initial drafter is
built here once: ``OUT/base/SOURCE-31`` (``convert --no-calibrate``: the structural EAGLE-3.1 conversion) for the 3.1
arms (``cal``, ``def``) and ``OUT/base/SOURCE-ctl`` (``convert --no-calibrate --keep-architecture``: the source in
the output layout) for the control. ``OUT/ARM@STEP`` is that folder with the trained tensors of the step replaced
(``arm_at_step.write_with``): every tensor a fine-tune changes is trained, so the folder is the device's drafter at
that step, in the same layout and dtype. The one exception is the step-0 fc_norm of a 3.1 arm, which the conversion
computes from the target's statistics (here in fp32, there in bf16): it is trained, so it is replaced at every step.
``best`` is the judge's choice (``ARM@best``; when the judge kept the initial weights, the base itself).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from arm_at_step import write_with  # noqa: E402
from common import tensor_sha256  # noqa: E402

from eagle_migrate import assets  # noqa: E402

from eagle_migrate.convert.eagle3 import scale_columns  # noqa: E402
from eagle_migrate.formats import read_checkpoint  # noqa: E402


def base(kind: str, src: str, path: Path, target: str, out: Path) -> Path:
    """The arm's initial drafter, built here once."""
    ctl = kind == "ctl"
    d = out / "base" / f"{src}-{'ctl' if ctl else '31'}"
    if not (d / "config.json").is_file():
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "eagle_migrate", "convert", str(path), "--target", target, "-o", str(d),
               "--no-calibrate", "--seed", "0", "--json", *(["--keep-architecture"] if ctl else [])]
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[2:5])} failed: {r.stderr.strip().splitlines()[-1:]}")
    return d


def structural(params: dict[str, dict], meta: dict[str, str], source: Path) -> dict[str, torch.Tensor]:
    """A 3.1 arm's initial tensors as the device's conversion chose them (``init/`` of the returned file): the
    fc_norm weights, and the norm_output fold (norm.weight = R flat, lm_head's columns scaled by the old norm weight / R,
    by the product's own ``scale_columns`` on the source's lm_head: bit for bit, checked against the device's sha256)
    or none (the source's norm and lm_head). The base built here may have chosen otherwise (its statistics data)."""
    init = params.get("init")
    if not init:
        return {}
    ck = read_checkpoint(source)
    out = {k: v for k, v in init.items() if k.startswith("fc_norm.")}
    r_bar = ast.literal_eval(meta["r_bar"])
    lm = ck.tensor("lm_head.weight", mapped=True)
    if r_bar is None:
        out["norm.weight"], out["lm_head.weight"] = ck.tensor("norm.weight"), lm
    else:
        out["norm.weight"] = torch.full((init["w_norm"].numel(),), r_bar)
        out["lm_head.weight"] = scale_columns(lm, init["w_norm"] / r_bar)
    want = meta.get("lm_head_sha256")
    if want:
        got = tensor_sha256(out["lm_head.weight"])
        if got != want:
            raise SystemExit(f"{source}: lm_head rebuilt here differs from the device's (sha256 {got[:12]} != {want[:12]})")
    return out


def device_config(arm: dict, base_dir: Path, meta: dict[str, str]) -> dict | None:
    """The config the device wrote (when the arm finished), else the base's with the device's norm_output scale:
    the base built here may have chosen another fc_norm initialisation and fold (its own statistics)."""
    if arm.get("config"):
        return arm["config"]
    if "r_bar" not in meta:
        return None
    cfg = json.loads((base_dir / "config.json").read_text())
    em = cfg.setdefault("eagle_migrate", {})
    em["norm_output_scale"] = ast.literal_eval(meta["r_bar"])
    em["note"] = "rebuilt from a device run that was stopped before writing: norm_init as chosen here"
    return cfg


def arm_params(f: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """{step label: {trainer name: tensor}} of one returned file, and its metadata."""
    out: dict[str, dict] = {}
    with safe_open(str(f), "pt") as sf:
        meta = sf.metadata() or {}
        for k in sf.keys():
            label, _, name = k.partition("/")
            out.setdefault(label.removeprefix("step"), {})[name] = sf.get_tensor(k)
    return out, meta


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--returned", type=Path, required=True, help="the device call's files (ARM.safetensors, ...)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--source", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct from the asset cache")
    ap.add_argument("--steps", default="best,last", help="labels to write: best, last, or step numbers")
    a = ap.parse_args(argv)
    if a.target is None:
        a.target = str(assets.smollm2_target())
    sources = {k: Path(v) for k, v in (s.split("=", 1) for s in a.source)}
    doc = a.returned / "warm_start_gpu.json"
    device_arms = json.loads(doc.read_text())["arms"] if doc.is_file() else {}
    written: dict[str, str] = {}
    for f in sorted(a.returned.glob("*.safetensors")):
        arm = f.stem
        src, kind = arm.rsplit("-", 1)
        params, meta = arm_params(f)
        b = base(kind, src, sources[src], a.target, a.out)
        init = structural(params, meta, sources[src])
        numeric = sorted(int(s) for s in params if s.isdigit())
        config = device_config(device_arms.get(arm, {}), b, meta)
        for label in a.steps.split(","):
            step = str(numeric[-1]) if label == "last" and numeric else label
            dest = a.out / f"{arm}@{label}"
            if dest.exists():
                written[dest.name] = str(dest)
                continue
            if label == "best" and int(meta.get("best_step", "0")) == 0:
                step = "init"  # the judge kept the initial weights: the device's structural conversion
            elif step not in params:
                continue
            trained = {} if step == "init" else params[step]
            if not init and not trained:
                written[dest.name] = str(b)  # the control's initial weights: the source, in the output layout
                continue
            write_with(b, {**init, **trained}, step if label != "best" else f"best (step {meta.get('best_step')})",
                       dest, note="a device fine-tune's tensors (benchmarks/gpu/warm_start_gpu.py: its structural "
                                  "choices and its trained tensors at this step) on the drafter built here "
                                  "(benchmarks/gpu/arms_from_device.py)", config=config)
            written[dest.name] = str(dest)
    (a.out / "arms.json").write_text(json.dumps(written, indent=1))
    print(json.dumps(written, indent=1))
    return written


if __name__ == "__main__":
    main()
