"""What the futility stop saves: convert + default calibration with the stop (``judge.futility``) and without it.

Pair: the toy successor world (``eagle_migrate/toy.py``: 6-layer Llama target, oracle EAGLE-3 drafter, as the demo
builds it); its source drafts at the ceiling (AL = k + 1), so no candidate can beat the structural conversion and
the default calibration returns it. Each arm is the same ``convert`` call (``--num-sequences 16``, CPU defaults:
60 steps, evaluation every 10, patience 3); the "off" arm replaces ``calibrate.futility`` by a rule that never
stops, i.e. the calibration as it was before the stop existed. Prints one JSON line per arm and run: convert's
wall time, the fine-tune's own time (``fit``: training steps and held-out evaluations), steps and evaluations run,
the stop reason and the held-out simulated AL before / after. Arms alternate in order between repeats.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_futility.py --out /tmp/futility [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import calibrate as calibrate_mod  # noqa: E402
from eagle_migrate import toy  # noqa: E402
from eagle_migrate.convert import convert  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--num-sequences", type=int, default=16)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    target, source = a.out / "target", a.out / "source"
    if not (target / "config.json").exists():
        toy.write_target(target)
    if not (source / "config.json").exists():
        toy.write_drafter(source, "oracle")
    rule = calibrate_mod.futility
    real_fit = calibrate_mod.fit
    fits: list = []

    def timed_fit(*args, **kwargs):  # the fine-tune's own time and evaluations (the rest of convert is the same)
        fr = real_fit(*args, **kwargs)
        fits.append(fr)
        return fr

    calibrate_mod.fit = timed_fit
    for rep in range(a.repeats):
        for arm in (("off", "on") if rep % 2 == 0 else ("on", "off")):  # alternate the order: load drifts
            calibrate_mod.futility = rule if arm == "on" else (lambda history, steps_left: None)
            out = a.out / f"conv-{arm}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            res = convert(source, str(target), out, num_sequences=a.num_sequences, device="cpu", seed=0)
            wall = time.perf_counter() - t0
            d = res.calibration.details or {}
            fr = fits[-1]
            print(json.dumps({"arm": arm, "repeat": rep, "convert_seconds": round(wall, 1),
                              "fit_seconds": round(fr.seconds, 1), "evaluations": len(fr.history),
                              "calibration_seconds": round(d.get("seconds", 0.0), 1), "steps_run": d.get("steps_run"),
                              "steps": (d.get("settings") or {}).get("steps"), "best_step": d.get("best_step"),
                              "stop_reason": d.get("stop_reason"), "score_before": d.get("score_before"),
                              "score_after": d.get("score_after"), "improved": d.get("improved")}), flush=True)
    calibrate_mod.futility = rule
    calibrate_mod.fit = real_fit


if __name__ == "__main__":
    main()
