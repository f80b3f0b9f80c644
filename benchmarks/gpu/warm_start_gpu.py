"""Issue 38 on a lent GPU: the warm-start arms at the GPU's defaults, side by side, each arm's trained tensors kept at
every evaluation so that the arms can be served here at equal work, whatever their judge returned.

    python3 benchmarks/gpu/warm_start_gpu.py --source plain=DIR --source best=DIR --work /tmp/em/ws --out $OUT \
        --max-minutes 4 --deadline-minutes 7 [--arms plain-cal,plain-ctl,...] [--smoke]

Arms, named ``SOURCE-KIND`` (every one a worker process running ``convert``, the library function, with its own
``resume_dir``; all on the one GPU at once):

* ``cal``: the 3.1 arm, ``convert --train norms+fc --data drift -n 128`` (the fine-tune that served a gain on the
  CPU, with the GPU's step count, judge and held-out sizes);
* ``ctl``: its control, the same with ``--keep-architecture`` (no 3.1 norm inserted);
* ``def``: ``convert`` with its defaults (on a GPU: ``--train norms`` on ShareGPT chat under the judge).

The parent reads each arm's resume state whenever the fine-tune saves it (every evaluation) and keeps its trained
tensors. At the end (or at ``--deadline-minutes``, when it stops the workers still running: their last saved state
stands) it writes, per arm, ``OUT/ARM.safetensors``: ``step{N}/{name}`` for the saved steps (in the dtype the output
folder is written in, bf16; at most ~15 MiB a file, steps thinned evenly if needed, the judge's choice always kept)
and ``best/{name}`` (the judge's choice so far, with ``best_step`` in the metadata), and ``OUT/warm_start_gpu.json``:
each arm's convert result (when it finished), its evaluation history, timings and the device. Logs go to
``OUT/logs.tar.gz``. ``benchmarks/gpu/arms_from_device.py`` turns them into drafter folders here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import OUT_FILE_LIMIT, ROOT, log, missing_on_device, tensor_sha256
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_migrate import assets

KINDS = {
    "cal": {"train": "norms+fc", "data": "drift", "num_sequences": 128},
    "ctl": {"train": "norms+fc", "data": "drift", "num_sequences": 128, "keep_architecture": True},
    "def": {},
}
# --smoke: every arm at toy sizes, to prove the script end to end on a CPU (calibrate's defaults shrunk to match)
SMOKE_CALIBRATION = {"steps": 4, "seq_len": 96, "eval_every": 2, "warmup": 0, "heldout_per_suite": 2,
                     "heldout_new_tokens": 6, "heldout_long_buckets": (160,), "heldout_long_per_bucket": 1,
                     "heldout_shift_max": 2}
SMOKE_KIND = {"num_sequences": 4, "seq_len": 128, "calibrate": True}  # a CPU only judges an EAGLE-3 source by default
STORE_DTYPE = torch.bfloat16  # convert writes SmolLM2's drafters in bf16: nothing finer would be served


def worker(spec: dict) -> None:
    """One arm: ``convert`` in this process, its result as JSON in ``work/ARM/result.json``."""
    from eagle_migrate import calibrate  # the worker's: the parent never converts
    from eagle_migrate.convert import convert
    from eagle_migrate.convert.eagle3 import Eagle3Converter

    if spec.get("smoke"):
        calibrate.DEFAULTS.update(SMOKE_CALIBRATION)
        calibrate.CPU_DEFAULTS.update(SMOKE_CALIBRATION)

    d = Path(spec["dir"])
    plan = Eagle3Converter._plan

    def keep_init(self, job, chosen_w, r_bar, w_norm):  # the structural conversion's own choices, exactly
        save_file({**{f"fc_norm.{i}.weight": w.float().contiguous() for i, w in enumerate(chosen_w)},
                   "w_norm": w_norm.float().contiguous()}, str(d / "init.safetensors"),
                  metadata={"r_bar": repr(r_bar)})
        return plan(self, job, chosen_w, r_bar, w_norm)

    Eagle3Converter._plan = keep_init  # a benchmark's hook: records, changes nothing
    t0 = time.time()
    last: dict[str, float] = {}

    def progress(stage: str, done: int, total: int | None, info: str = "") -> None:  # plain lines, every 15 s
        now = time.time()
        if now - last.get(stage, 0.0) >= 15 or done == total:
            last[stage] = now
            print(f"[{now - t0:6.1f} s] {stage} {done}/{total} {info}", file=sys.stderr, flush=True)

    res = convert(spec["source"], spec["target"], d / "out", resume_dir=d / "resume", seed=0, progress=progress,
                  max_minutes=spec["max_minutes"], command=f"benchmarks/gpu/warm_start_gpu.py ({spec['arm']})",
                  **spec["options"])
    (d / "result.json").write_text(json.dumps({"seconds": round(time.time() - t0, 1),
                                               "result": json.loads(res.model_dump_json())}, indent=1))


class Arm:
    """A worker process and the trained tensors of every state it saved."""

    def __init__(self, name: str, proc: subprocess.Popen, d: Path) -> None:
        self.name, self.proc, self.dir = name, proc, d
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.best: dict[str, torch.Tensor] = {}
        self.best_step, self.history, self.seen = 0, [], None
        self.t_states: dict[int, float] = {}

    def poll(self, t0: float) -> None:
        f = self.dir / "resume" / "state.pt"
        if not f.is_file() or (m := f.stat().st_mtime_ns) == self.seen:
            return
        try:
            st = torch.load(f, map_location="cpu", weights_only=True)  # our own file, tensors only
        except Exception as e:  # noqa: BLE001 - replaced mid-read: the next poll reads the new one
            log(f"{self.name}: state not readable yet ({type(e).__name__})")
            return
        self.seen = m
        step = int(st["step"])
        self.states[step] = {n: t.to(STORE_DTYPE) for n, t in st["params"].items()}
        self.best = {n: t.to(STORE_DTYPE) for n, t in st["best"].items()}
        self.best_step, self.history = int(st["best_step"]), st["history"]
        self.t_states[step] = round(time.time() - t0, 1)
        log(f"{self.name}: state at step {step} (best step {self.best_step})")


def thin(steps: list[int], keep: set[int], bytes_per: int, limit: int) -> list[int]:
    """The saved steps whose tensors fit ``limit`` bytes together with one more set (the judge's choice): all of
    them when they fit, else ``keep`` and evenly spaced others, the last one always among them."""
    room = max(1, limit // max(1, bytes_per) - 1)
    if len(steps) <= room:
        return steps
    kept = sorted(keep & set(steps))[:room]
    others = [s for s in steps if s not in keep]
    n = room - len(kept)
    if n <= 0 or not others:
        return kept
    idx = [len(others) - 1] if n == 1 else sorted({round(i * (len(others) - 1) / (n - 1)) for i in range(n)})
    return sorted(set(kept) | {others[i] for i in idx})


def pack(arm: Arm, out: Path, limit: int = OUT_FILE_LIMIT) -> dict:
    """``OUT/ARM.safetensors`` with the kept steps and the judge's choice; what it holds."""
    steps = sorted(arm.states)
    per = sum(t.numel() * t.element_size() for t in next(iter(arm.states.values())).values()) if steps else 0
    kept = thin(steps, {arm.best_step}, per, limit - 64 * 2**10)  # init/: fc_norm + w_norm, a few KiB
    tensors = {f"step{s}/{n}": t.contiguous() for s in kept for n, t in arm.states[s].items()}
    tensors |= {f"best/{n}": t.clone().contiguous() for n, t in arm.best.items()}  # never shares a step's storage
    meta = {"steps": json.dumps(kept), "best_step": str(arm.best_step), "arm": arm.name}
    init = arm.dir / "init.safetensors"  # a 3.1 arm's structural choices (fc_norm init, the norm_output fold)
    if init.is_file():
        with safe_open(str(init), "pt") as sf:
            tensors |= {f"init/{k}": sf.get_tensor(k) for k in sf.keys()}
            meta["r_bar"] = (sf.metadata() or {})["r_bar"]
    lm = lm_head_sha256(arm.dir / "out")
    if lm:
        meta["lm_head_sha256"] = lm
    if tensors:
        save_file(tensors, str(out / f"{arm.name}.safetensors"), metadata=meta)
    return {"steps_saved": steps, "steps_returned": kept, "best_step": arm.best_step, "history": arm.history,
            "state_seconds": arm.t_states, "bytes_per_step": per, "meta": meta}


def lm_head_sha256(folder: Path) -> str | None:
    """sha256 of the written lm_head's bytes (the one tensor a 3.1 conversion changes that no fine-tune trains):
    arms_from_device.py rebuilds it here and checks it against this."""
    for f in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        with safe_open(str(f), "pt") as sf:
            if "lm_head.weight" in sf.keys():
                return tensor_sha256(sf.get_tensor("lm_head.weight"))
    return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", action="append", default=[], metavar="NAME=DIR", help="an EAGLE-3 source (repeatable)")
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct from the asset cache")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", default=None, help="comma-separated SOURCE-KIND (default: every source x cal, ctl, def)")
    ap.add_argument("--max-minutes", type=float, required=True, help="each fine-tune's wall-clock budget")
    ap.add_argument("--deadline-minutes", type=float, required=True,
                    help="from the script's start: workers still running then are stopped (their saved states stand)")
    ap.add_argument("--file-mib", type=float, default=OUT_FILE_LIMIT / 2**20,
                    help="each arm's returned file at most this large (the tool returns 64 MiB a call in all)")
    ap.add_argument("--logs", type=Path, default=None, help="a folder whose files go into OUT/logs.tar.gz too")
    ap.add_argument("--smoke", action="store_true", help="toy sizes, to prove the script on a CPU")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(json.loads(a.worker))
        return {}
    t0 = time.time()
    target = a.target or str(assets.smollm2_target())
    sources = dict(s.split("=", 1) for s in a.source)
    names = a.arms.split(",") if a.arms else [f"{s}-{k}" for s in sources for k in KINDS]
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    arms: list[Arm] = []
    for name in names:
        src, kind = name.rsplit("-", 1)
        d = a.work / name
        d.mkdir(parents=True, exist_ok=True)
        spec = {"arm": name, "source": sources[src], "target": target, "dir": str(d), "smoke": a.smoke,
                "max_minutes": a.max_minutes, "options": {**KINDS[kind], **(SMOKE_KIND if a.smoke else {})}}
        with open(d / "worker.log", "w") as err:
            p = subprocess.Popen([sys.executable, __file__, "--work", str(a.work), "--out", str(a.out), "--max-minutes",
                                  "0", "--deadline-minutes", "0", "--worker", json.dumps(spec)],
                                 stdout=err, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=False)
        arms.append(Arm(name, p, d))
        log(f"{name}: started (pid {p.pid}) {spec['options']}")
    deadline = t0 + a.deadline_minutes * 60
    while any(x.proc.poll() is None for x in arms) and time.time() < deadline:
        for x in arms:
            x.poll(t0)
        time.sleep(2)
    stopped = [x.name for x in arms if x.proc.poll() is None]
    for x in arms:
        if x.proc.poll() is None:
            log(f"{x.name}: deadline, stopping it")
            x.proc.send_signal(signal.SIGTERM)
    for x in arms:
        try:
            x.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            x.proc.kill()
        x.poll(t0)
    doc: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                 "torch": torch.__version__, "smoke": a.smoke, "max_minutes": a.max_minutes, "stopped": stopped,
                 "arms": {}}
    for x in arms:
        r = x.dir / "result.json"
        doc["arms"][x.name] = {"exit": x.proc.returncode, **pack(x, a.out, int(a.file_mib * 2**20)),
                               "convert": json.loads(r.read_text()) if r.is_file() else None}
        cfg = x.dir / "out" / "config.json"
        if cfg.is_file():
            doc["arms"][x.name]["config"] = json.loads(cfg.read_text())
    doc["seconds"] = round(time.time() - t0, 1)
    doc["missing_on_device"] = missing_on_device()
    (a.out / "warm_start_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    with tarfile.open(a.out / "logs.tar.gz", "w:gz") as tf:
        for x in arms:
            tf.add(x.dir / "worker.log", arcname=f"{x.name}.log")
        for f in sorted(a.logs.iterdir()) if a.logs and a.logs.is_dir() else []:
            if f.is_file():
                tf.add(f, arcname=f.name)
    compact = {n: {"exit": v["exit"], "best_step": v["best_step"], "steps": v["steps_saved"],
                   "history": [{k: h.get(k) for k in ("step", "score", "best_step")} for h in v["history"]]}
               for n, v in doc["arms"].items()}
    print("SUMMARY " + json.dumps({"seconds": doc["seconds"], "stopped": stopped, "device": doc["device"],
                                   "missing_on_device": doc["missing_on_device"], "arms": compact}, default=str),
          flush=True)
    return doc


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
