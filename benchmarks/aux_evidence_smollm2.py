"""How long the aux-id decision takes on a real pair, and whether it decides right (issue 27).

The source: an EAGLE-3 drafter for SmolLM2-135M-Instruct trained by speculators' own CLI
(benchmarks/train_speculators_smollm2.sh, STOP=train), captured at vLLM ids [2, 15, 27]. It is re-written in the
``midlayer.*`` layout that vLLM and SGLang both load, with no producer fingerprint, three ways:

* ``vllm``: ids [2, 15, 27] (vLLM's convention);
* ``output-of-layer``: ids [1, 14, 26] (the same layers, stored as SpecForge / ModelOpt training stores them);
* ``vllm-no-nbr``: as ``vllm`` without ``norm_before_residual`` in the config (the drafter was trained with it on;
  the layout's default is off): the flag is then decided by the same measurement.

For each, the decision convert makes (``aux_evidence.resolve_for_target`` on convert's own data and statistics
sequences, then ``norm_before_residual`` where the config omits it) runs in this process; its evidence, whether it
is right, and its wall and CPU seconds (target and drafter load included) are printed as one JSON line per variant.
``--convert`` also runs ``eagle-migrate convert --target SmolLM2 --no-calibrate`` end to end in a subprocess.

    python benchmarks/aux_evidence_smollm2.py SRC WORKDIR [--variants vllm,output-of-layer,vllm-no-nbr] [--convert]

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
        t.mkdir()
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


def decide(src: Path, target: str, data: str | None, seed: int = 0) -> dict:
    """The decision as convert makes it (aux_evidence.resolve_for_target, then norm_before_residual when the config
    omits it), in this process: wall and CPU seconds, target and drafter load included, data reading excluded (the
    sequences are what convert's statistics pass reads anyway)."""
    import torch

    from eagle_migrate import aux_evidence as ev
    from eagle_migrate.calibration_data import resolve_data
    from eagle_migrate.convert.records import sequences_for
    from eagle_migrate.formats import read_checkpoint
    from eagle_migrate.target import LazyTarget

    ck = read_checkpoint(src)
    lt = LazyTarget(target, "cpu", torch.float32)
    data, _ = resolve_data(data, lt.tokenizer)
    first = sequences_for(data, lt, 32, seed, 512)  # convert's statistics sequences (defaults)
    print(f"{src.name}: data {data}, {len(first)} statistics sequences", file=sys.stderr, flush=True)
    lt._target = None  # the measurement loads the target itself (counted)
    w0, c0 = time.perf_counter(), time.process_time()
    def tick(done: int, total: int) -> None:
        print(f"  sequence {done} ({time.perf_counter() - w0:.0f} s wall, {time.process_time() - c0:.0f} s cpu)", file=sys.stderr, flush=True)

    a = ev.resolve_for_target(ck, lt, seed=seed, data=data, sequences=first, progress=tick)
    w1, c1 = time.perf_counter(), time.process_time()
    nbr = None
    if a.decided and a.ids is not None:
        from eagle_migrate.formats import aux_ids

        aux_ids.apply(ck, a)
        nbr = ev.decide_norm_before_residual(ck, lt, a.ids, seed=seed, data=data, sequences=first, progress=tick)
    w2, c2 = time.perf_counter(), time.process_time()
    m = a.measurement
    return {
        "decided": a.convention, "decided_by": a.decided_by, "vllm_ids": a.ids, "correct": a.ids == TRUE_IDS,
        "aux_wall_s": round(w1 - w0, 1), "aux_cpu_s": round(c1 - c0, 1), "nbr_wall_s": round(w2 - w1, 1),
        "nbr_cpu_s": round(c2 - c1, 1), "data": data,
        "statistic": m.statistic if m else None, "mean": m.mean if m else None, "agreement": m.agreement if m else None,
        "difference": m.difference if m else None, "se": m.standard_error if m else None,
        "z": round(m.difference / m.standard_error, 1) if m and m.standard_error else None,
        "positions": m.positions if m else None, "sequences": m.sequences if m else None, "looks": m.looks if m else None,
        "nbr": None if nbr is None else {"verdict": nbr.verdict, "winner": nbr.winner, "mean": nbr.mean,
                                         "difference": nbr.difference, "se": nbr.standard_error,
                                         "positions": nbr.positions, "sequences": nbr.sequences},
        "nbr_after": ck.config.norm_before_residual,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--variants", default="vllm,output-of-layer,vllm-no-nbr")
    ap.add_argument("--data", default=None, help="convert's --data (default: what convert picks: ShareGPT here)")
    ap.add_argument("--convert", action="store_true", help="also run `convert --no-calibrate` end to end (subprocess)")
    a = ap.parse_args()
    from eagle_migrate import assets

    target = str(assets.smollm2_target())
    a.work.mkdir(parents=True, exist_ok=True)
    for v in a.variants.split(","):
        d = a.work / f"src-{v}"
        if not d.exists():
            rewrite(a.src, d, v)
        row = {"variant": v, "load_avg_1m": os.getloadavg()[0], **decide(d, target, a.data)}
        if a.convert:
            r = run_convert(d, a.work / f"out-{v}-{int(time.time())}", target)
            row.update(convert_rc=r["rc"], convert_wall_s=r["wall_s"], convert_aux_ids_stage_done_at_s=r["stage_last_s"].get("aux ids"),
                       convert_error=(r["result"] or {}).get("error"))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
