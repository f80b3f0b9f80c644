"""How long the aux-id decision takes on a real pair, and whether it decides right (issue 27).

The source: an EAGLE-3 drafter for SmolLM2-135M-Instruct trained by speculators' own CLI
(benchmarks/train_speculators_smollm2.sh, STOP=train), captured at vLLM ids [2, 15, 27]. It is re-written in the
``midlayer.*`` layout that vLLM and SGLang both load, with no producer fingerprint, three ways:

* ``vllm``: ids [2, 15, 27] (vLLM's convention);
* ``output-of-layer``: ids [1, 14, 26] (the same layers, stored as SpecForge / ModelOpt training stores them);
* ``vllm-no-nbr``: as ``vllm`` without ``norm_before_residual`` in the config (the drafter was trained with it on;
  the layout's default is off): the flag is then decided by the same measurement.

For each, ``eagle-migrate convert --target SmolLM2 --no-calibrate`` runs in a subprocess (what a user runs); the
result's ``aux_ids_evidence`` (and ``norm_before_residual_evidence``) and the wall time of the decision (the
"aux ids" progress stage: measurement, target load included) and of the whole convert are printed as JSON lines.

    python benchmarks/aux_evidence_smollm2.py SRC WORKDIR [--variants vllm,output-of-layer,vllm-no-nbr]

SRC: the speculators checkpoint folder (e.g. runs/speculators-smollm2/checkpoints-plain/2). Run with
OMP_NUM_THREADS=2 on the 2-core box (docs/benchmarks.md, "Aux-id evidence").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRUE_IDS = [2, 15, 27]  # vLLM ids the drafter was trained on


def rewrite(src: Path, out: Path, variant: str) -> Path:
    """``src`` (any layout) as a fingerprint-free ``midlayer.*`` vLLM-layout checkpoint with the ids of ``variant``."""
    import tempfile

    from safetensors.torch import load_file, save_file

    from eagle_migrate.formats import read_checkpoint
    from eagle_migrate.formats.write import write_vllm

    ck = read_checkpoint(src)
    if ck.config.aux_layer_ids != TRUE_IDS:
        raise SystemExit(f"{src}: expected a drafter captured at vLLM ids {TRUE_IDS}, found {ck.config.aux_layer_ids}")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / "w"
        write_vllm(ck.config, {n: ck.tensor(n) for n in ck.canonical_names() if n != "t2d"}, t)
        sd = load_file(str(t / "model.safetensors"))
        cfg = json.loads((t / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=False)
    save_file({k.replace("layers.0.", "midlayer.", 1): v for k, v in sd.items()}, str(out / "model.safetensors"), {"format": "pt"})
    cfg.pop("eagle_migrate", None)
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    ids = [i - 1 for i in TRUE_IDS] if variant == "output-of-layer" else list(TRUE_IDS)
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    if variant == "vllm-no-nbr":
        cfg.pop("norm_before_residual", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def run_convert(src: Path, out: Path, target: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "eagle_migrate", "convert", str(src), "--target", target, "-o", str(out),
           "--no-calibrate", "--json"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stages: dict[str, float] = {}
    first_seen: dict[str, float] = {}
    assert p.stderr is not None
    for line in p.stderr:  # progress lines: "convert: <stage> ..." (no TTY)
        now = time.perf_counter() - t0
        for st in ("aux ids", "norm_before_residual", "statistics", "write"):
            if st in line:
                first_seen.setdefault(st, now)
                stages[st] = now
    out_s, _ = p.communicate()
    wall = time.perf_counter() - t0
    doc = json.loads(out_s) if out_s.strip() else {}
    return {"rc": p.returncode, "wall_s": round(wall, 1), "stage_first_s": {k: round(v, 1) for k, v in first_seen.items()},
            "stage_last_s": {k: round(v, 1) for k, v in stages.items()}, "result": doc}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--variants", default="vllm,output-of-layer,vllm-no-nbr")
    a = ap.parse_args()
    from eagle_migrate import assets

    target = str(assets.smollm2_target())
    a.work.mkdir(parents=True, exist_ok=True)
    for v in a.variants.split(","):
        d = a.work / f"src-{v}"
        if not d.exists():
            rewrite(a.src, d, v)
        r = run_convert(d, a.work / f"out-{v}-{int(time.time())}", target)
        doc = r["result"]
        ev = doc.get("aux_ids_evidence") or {}
        m = ev.get("measurement") or {}
        nbr = doc.get("norm_before_residual_evidence") or {}
        aux_s = r["stage_last_s"].get("aux ids")
        print(json.dumps({
            "variant": v, "rc": r["rc"], "convert_wall_s": r["wall_s"],
            "decision_s": m.get("seconds"), "aux_ids_stage_done_at_s": aux_s,
            "nbr_stage_done_at_s": r["stage_last_s"].get("norm_before_residual"),
            "decided": ev.get("convention"), "decided_by": ev.get("decided_by"), "vllm_ids": doc.get("aux_layer_ids"),
            "correct": doc.get("aux_layer_ids") == TRUE_IDS,
            "statistic": m.get("statistic"), "mean": m.get("mean"), "agreement": m.get("agreement"),
            "difference": m.get("difference"), "se": m.get("standard_error"),
            "z": (m["difference"] / m["standard_error"]) if m.get("standard_error") else None,
            "positions": m.get("positions"), "sequences": m.get("sequences"), "looks": m.get("looks"),
            "nbr": {k: nbr.get(k) for k in ("verdict", "readings", "mean", "difference", "standard_error", "positions", "seconds")} if nbr else None,
            "error": doc.get("error"),
        }), flush=True)


if __name__ == "__main__":
    main()
