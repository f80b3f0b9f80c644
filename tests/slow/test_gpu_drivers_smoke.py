"""The GPU drivers of issue 20 (benchmarks/gpu/, README.md there) end to end at toy sizes on the CPU, on the real
SmolLM2 pair: ``train_source.py --smoke`` trains a plain EAGLE-3 source, ``recipe_search.py --smoke`` converts it
(structural + ``convert``'s defaults) and runs one calibration recipe. A GPU session runs them with real sizes;
these smokes are what says they will not break there: each writes a drafter our loader reads, in files the device
tool returns (under 16 MiB each, at most 8 a call), with the result fields the README's plan reads, and imports
nothing the device image lacks (it has no vLLM: the held-out continuations must come from transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 16 * 2**20


def _run(script: str, *args: str, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           # as on the device machine: no vLLM to generate the held-out continuations with
           "EAGLE_MIGRATE_VLLM_PYTHON": str(tmp / "no-such-python")}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / script), *args], env=env, cwd=ROOT, check=False,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("SUMMARY ")][-1]
    return json.loads(line.removeprefix("SUMMARY "))


@pytest.fixture(scope="module")
def smollm2():
    from eagle_migrate import assets

    return assets.smollm2_target()


@pytest.fixture(scope="module")
def source(tmp_path_factory, smollm2):
    tmp = tmp_path_factory.mktemp("gpu-smoke")
    summary = _run("train_source.py", "--arch", "eagle3", "--smoke", "--run", str(tmp / "run"), "--out",
                   str(tmp / "e3"), "--max-minutes", "2", tmp=tmp)
    return tmp, summary


def _loads(folder: Path, smollm2):
    from eagle_migrate.loader import load_drafter
    from eagle_migrate.target import load_target

    files = [f for f in folder.iterdir() if f.is_file()]
    assert all(f.stat().st_size < LIMIT for f in files)
    target = load_target(str(smollm2), device="cpu")
    return load_drafter(folder, target), files


def test_train_source_smoke_writes_a_plain_eagle3_source(source, smollm2):
    tmp, s = source
    assert s["done"] and s["step"] == s["steps"] == 2 and s["arch"] == "eagle3"
    assert s["missing_on_device"] == []
    assert s["heldout_simulated_al_k3"] >= 1.0 and len(s["heldout_per_position"]) == 3
    saved = json.loads((tmp / "e3" / "training.json").read_text())
    for key in ("step", "steps", "done", "epochs", "last_loss", "heldout_simulated_al_k3", "command", "files", "seed"):
        assert key in saved
    model, files = _loads(tmp / "e3", smollm2)
    cfg = model.cfg
    assert (cfg.norm_before_residual, cfg.fc_norm, cfg.norm_output) == (False, False, False)  # original EAGLE-3
    assert cfg.draft_vocab_size == 1024 and cfg.aux_layer_ids == [2, 15, 27]
    assert len(files) <= 8
    assert (tmp / "run" / "latest-eagle3" / "config.json").exists()  # recipe_search.py's --source on the device


def test_recipe_search_smoke_converts_and_ranks(source, smollm2):
    tmp, _ = source
    out = tmp / "out"
    s = _run("recipe_search.py", "--smoke", "--source", str(tmp / "e3"), "--work", str(tmp / "work"), "--out",
             str(out), tmp=tmp)
    assert s["missing_on_device"] == []
    res = json.loads((out / "recipes.json").read_text())
    assert res["_missing_on_device"] == []
    assert {"structural", "defaults", "smoke"} <= set(res)
    for name in ("defaults", "smoke"):
        r = res[name]
        assert r["drift_score"] is not None and set(r["after"]) == {"chat", "long", "template-shift"}
        assert r["steps_run"] == 2
    assert res["smoke"]["recipe"] == {"train": "norms+fc", "seq_len": 96, "data": "mix", "k": 3, "steps": 2,
                                      "sequences": 3}
    assert set(res["smoke"]["source"]) == {"chat", "long", "template-shift"}  # compared with the source
    assert "defaults" in res["_kept"] and s["kept"] == res["_kept"]
    assert sum(1 for f in out.rglob("*") if f.is_file()) <= 8
    model, _ = _loads(out / "defaults", smollm2)
    assert model.cfg.fc_norm and model.cfg.norm_output  # the EAGLE-3.1 conversion
    assert (out / "defaults" / "provenance.json").exists()


def test_train_source_smoke_control_is_eagle31_on_the_same_vocabulary(source, smollm2):
    """Item 2's control: EAGLE-3.1 from scratch with the source's draft vocabulary (shared through --run)."""
    import torch

    tmp, s3 = source
    s = _run("train_source.py", "--arch", "eagle31", "--smoke", "--run", str(tmp / "run"), "--out", str(tmp / "e31"),
             "--steps", str(s3["steps"]), "--max-minutes", "2", tmp=tmp)
    assert s["done"] and s["steps"] == s3["steps"] and s["missing_on_device"] == []
    control, _ = _loads(tmp / "e31", smollm2)
    src, _ = _loads(tmp / "e3", smollm2)
    assert control.cfg.fc_norm and control.cfg.norm_output and not control.cfg.norm_before_residual
    ids = torch.arange(control.cfg.draft_vocab_size)
    assert torch.equal(control.to_target_ids(ids), src.to_target_ids(ids))


def test_warm_start_gpu_smoke_rebuilds_the_devices_drafters_here(tmp_path, smollm2):
    """Issue 38's GPU run (warm_start_gpu.py) at toy sizes on the committed plain source, then arms_from_device.py:
    the drafter rebuilt here from what comes back (the 3.1 arm's structural choices and trained tensors; the
    control's trained tensors) is the device's own output tensor for tensor, config included, and each arm's
    last step differs from its initial weights in the trained tensors only."""
    import torch
    from safetensors.torch import load_file

    plain = ROOT / "benchmarks" / "strong_source" / "plain"
    out, work = tmp_path / "out", tmp_path / "work"
    s = _run("warm_start_gpu.py", "--smoke", "--source", f"plain={plain}", "--arms", "plain-cal,plain-ctl", "--work",
             str(work), "--out", str(out), "--max-minutes", "3", "--deadline-minutes", "8", "--file-mib", "4",
             tmp=tmp_path)
    assert s["missing_on_device"] == [] and s["stopped"] == []
    assert {a: v["exit"] for a, v in s["arms"].items()} == {"plain-cal": 0, "plain-ctl": 0}
    files = [f for f in out.iterdir() if f.is_file()]
    assert len(files) <= 8 and all(f.stat().st_size < LIMIT for f in files)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "arms_from_device.py"), "--returned",
                        str(out), "--out", str(tmp_path / "arms"), "--source", f"plain={plain}", "--steps", "best,last"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads((tmp_path / "arms" / "arms.json").read_text())

    def tensors(d: str) -> dict:
        return {k: v for f in sorted(Path(d).glob("*.safetensors")) for k, v in load_file(str(f)).items()}

    for arm in ("plain-cal", "plain-ctl"):
        device, here = tensors(str(work / arm / "out")), tensors(built[f"{arm}@best"])
        assert sorted(device) == sorted(here) and all(torch.equal(device[k], here[k]) for k in device), arm
        assert json.loads((work / arm / "out" / "config.json").read_text()) == \
            json.loads((Path(built[f"{arm}@best"]) / "config.json").read_text())
        last = tensors(built[f"{arm}@last"])
        changed = {k for k in device if not torch.equal(device[k], last[k])}
        assert changed and changed <= {"fc.weight", "norm.weight"} | {k for k in device if "norm" in k}, changed
