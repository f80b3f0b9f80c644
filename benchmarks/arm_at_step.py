"""A fine-tune's weights at a chosen step, whatever its judge returned: for comparing two arms at equal work (issue 38:
the EAGLE-3.1 arm and its control at the same step, when the judge kept one and not the other).

    python benchmarks/arm_at_step.py --out DIR --step 20 -- convert SRC --target T --train norms+fc --data drift ...

runs ``eagle-migrate ARGS -o DIR/run --resume DIR/resume --json`` (the fine-tune saves its resume state every
evaluation), keeps a copy of the resume state of each step it saves (``DIR/resume/state-N.pt``), and writes
``DIR/step-N``: the run's output folder with every trained tensor replaced by its value at step N, in the folder's own
dtype. Only the trained tensors change in a fine-tune, so the rest of the returned folder is the step-N drafter's
whichever step the judge returned. The product never returns weights its judge did not keep; this is a measurement
tool, and ``DIR/step-N/arm_at_step.json`` says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle_migrate.formats import read_checkpoint  # noqa: E402
from eagle_migrate.formats.output import atomic_output_dir  # noqa: E402


def run_keeping_states(args: list[str], out: Path, poll: float = 1.0) -> dict:
    """The command with ``--resume out/resume``; a copy of each saved state as ``state-STEP.pt``; its JSON result."""
    rdir, state = out / "resume", out / "resume" / "state.pt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(out / "commands.log", "a") as err:
        p = subprocess.Popen([sys.executable, "-m", "eagle_migrate", *args, "-o", str(out / "run"), "--resume",
                              str(rdir), "--json"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        seen = None

        def keep() -> None:
            nonlocal seen
            if state.is_file() and (m := state.stat().st_mtime_ns) != seen:  # written atomically (rename)
                step = int(torch.load(state, map_location="cpu", weights_only=True)["step"])
                shutil.copyfile(state, rdir / f"state-{step}.pt")
                seen = m

        while p.poll() is None:
            keep()
            time.sleep(poll)
        keep()
        stdout = p.stdout.read()
    if p.returncode not in (0, 1):
        raise SystemExit(f"eagle-migrate {' '.join(args[:1])} failed (exit {p.returncode}); see {out / 'commands.log'}")
    return json.loads(stdout)


def write_at_step(run: Path, state_file: Path, dest: Path) -> list[str]:
    """``run`` copied to ``dest`` with the trained tensors of ``state_file``; the names replaced."""
    st = torch.load(state_file, map_location="cpu", weights_only=True)
    return write_with(run, st["params"], int(st["step"]), dest)


def write_with(run: Path, params: dict[str, torch.Tensor], step: int | str, dest: Path,
               note: str = "benchmark weights: the fine-tune's trained tensors at this step, whatever its judge "
                           "returned", config: dict | None = None) -> list[str]:
    """``run`` copied to ``dest`` with ``params`` (trained tensors by the trainer's names) in the folder's dtype
    (and ``config`` as its config.json when given)."""
    ck = read_checkpoint(run)
    missing = [n for n in params if n not in ck.name_map]
    if missing:
        raise SystemExit(f"{run}: no tensor {missing[0]} (trained) in the output folder")
    stored = {ck.name_map[n]: t for n, t in params.items()}
    done: list[str] = []
    with atomic_output_dir(dest, inputs=[run]) as tmp:  # the project's output folder: appears whole or not at all
        shutil.copytree(run, tmp, dirs_exist_ok=True)
        for f in sorted(tmp.glob("*.safetensors")):
            with safe_open(str(f), "pt") as sf:
                meta, tensors = sf.metadata(), {k: sf.get_tensor(k) for k in sf.keys()}
            hit = [k for k in tensors if k in stored]
            for k in hit:
                tensors[k] = stored[k].to(tensors[k].dtype).reshape(tensors[k].shape).contiguous()
            if hit:
                save_file(tensors, str(f), metadata=meta)
                done += hit
        if sorted(done) != sorted(stored):
            raise SystemExit(f"{run}: replaced {len(done)} of {len(stored)} trained tensors")
        if config is not None:
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "arm_at_step.json").write_text(json.dumps(
            {"step": step, "from": str(run), "replaced": sorted(done), "note": note}, indent=1))
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--step", type=int, action="append", required=True, help="repeatable")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- convert SRC ... (the fine-tune, without -o)")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    a.out.mkdir(parents=True, exist_ok=True)
    if not (a.out / "run" / "config.json").is_file():
        res = run_keeping_states(args, a.out)
        (a.out / "run.json").write_text(json.dumps(res, indent=1, default=str))
    for n in a.step:
        f = a.out / "resume" / f"state-{n}.pt"
        if not f.is_file():
            have = sorted(int(p.stem.split("-")[1]) for p in (a.out / "resume").glob("state-*.pt"))
            raise SystemExit(f"no state saved at step {n} (saved: {have}); the fine-tune saves at each evaluation")
        if not (a.out / f"step-{n}" / "config.json").is_file():
            write_at_step(a.out / "run", f, a.out / f"step-{n}")
        print(a.out / f"step-{n}")


if __name__ == "__main__":
    main()
