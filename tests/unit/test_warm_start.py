"""benchmarks/warm_start.py's comparison (issue 38): every arm against the source and each calibrated arm against its
control, paired per request, with the long buckets pooled; on synthetic per-request counters whose truth is known."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    """benchmarks/NAME.py as a module (NAME may name a subfolder: ``gpu/warm_start_gpu``)."""
    spec = importlib.util.spec_from_file_location(Path(name).name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[Path(name).name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ws():
    return _bench("warm_start")


def _reqs(rate: float, n: int, seed: int, drafts: int = 40) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        acc = sum(rng.random() < rate for _ in range(drafts * 3))
        out.append({"num_drafts": drafts, "num_accepted_tokens": acc, "accepted_per_position": [acc, 0, 0]})
    return out


def test_compare_pairs_each_arm_with_the_source_and_each_calibration_with_its_control(ws):
    cells = ("chat", "long/1k", "long/2k")
    drift = {"per_request": {
        "source": {c: _reqs(0.2, 24, i) for i, c in enumerate(cells)},
        "structural": {c: _reqs(0.2, 24, i) for i, c in enumerate(cells)},  # the same counters: ratio 1, SE 0
        "cal-norms": {c: _reqs(0.3, 24, 10 + i) for i, c in enumerate(cells)},  # clearly better
        "ctl-norms": {c: _reqs(0.3, 24, 10 + i) for i, c in enumerate(cells)},  # the same as the calibrated arm
        "cal-norms@20": {c: _reqs(0.3, 24, 20 + i) for i, c in enumerate(cells)},  # an arm at a step: vs its control
    }}
    out = ws.compare(drift, list(drift["per_request"]))
    assert set(out) == {*cells, "long"}  # the long buckets pooled
    assert set(out["chat"]) == {"structural / source", "cal-norms / source", "ctl-norms / source", "cal-norms / ctl-norms",
                                "cal-norms@20 / source", "cal-norms@20 / ctl-norms"}
    assert out["chat"]["structural / source"]["ratio"] == pytest.approx(1.0)
    better = out["long"]["cal-norms / source"]
    assert better["ratio"] > 1.1 and better["ratio"] - 2 * better["se"] > 1.0 and better["verdict"] == "improved"
    assert better["requests"] == 48 and out["chat"]["cal-norms / source"]["requests"] == 24
    ctl = out["long"]["cal-norms / ctl-norms"]
    assert ctl["ratio"] == pytest.approx(1.0) and ctl["verdict"] != "improved"


def test_arms_with_the_same_weights_are_served_once_and_said_to_be(ws, tmp_path):
    """A fine-tune whose judge returned its initial weights is its initial drafter: twins() finds it by the drafter as
    read (config and canonical tensors, in any producer's layout; not the files' names or metadata), compare() says
    "same weights", and served() merges an arm served later only when its prompts and settings are the run's."""
    import json

    import torch

    from eagle_migrate import toy
    from eagle_migrate.formats import read_checkpoint
    from tests.layouts import write_layout

    cfg = toy.drafter_config()
    base_sd = toy.drafter_state_dict("random")

    def arm(name: str, layout: str, scale: float, like: Path | None = None) -> Path:
        if like is not None:  # the tensors as another folder holds them (a control that returned its source)
            ck = read_checkpoint(like)
            sd = {n: ck.tensor(n) for n in ck.canonical_names()}
        else:
            sd = {n: t * scale if n == "fc.weight" else t for n, t in base_sd.items()}
        return write_layout(layout, cfg, sd, tmp_path / name, dtype=torch.bfloat16)  # convert keeps the dtype

    src = arm("source", "speculators", 1.0)
    paths = {"source": src, "structural": arm("structural", "vllm", 2.0), "cal-all": arm("cal-all", "vllm", 2.0),
             "ctl-all": arm("ctl-all", "vllm", 1.0, like=src), "new": arm("new", "vllm", 3.0)}
    assert read_checkpoint(paths["ctl-all"]).layout != read_checkpoint(src).layout  # written differently
    assert ws.twins(paths) == {"cal-all": "structural", "ctl-all": "source"}
    per = {n: {"chat": _reqs(0.2 if n != "new" else 0.3, 8, 1)} for n in ("source", "structural", "new")}
    twin = ws.twins(paths)
    for n, t in twin.items():
        per[n] = per[t]
    out = ws.compare({"per_request": per}, list(paths), twin)
    assert out["chat"]["ctl-all / source"]["verdict"] == "same weights (served once)"
    assert out["chat"]["cal-all / ctl-all"]["verdict"] != "same weights (served once)"
    # an arm added to a served run: merged from its own folder when the prompts match, refused when they do not
    d = tmp_path / "drift-k3"
    (d / "add-new").mkdir(parents=True)
    base = {"settings": {"k": 3}, "cells": [{"hash": "sha256:1"}], "per_request": {n: per[n] for n in ("source", "structural")}}
    (d / "drift.json").write_text(json.dumps(base))
    (d / "add-new" / "drift.json").write_text(json.dumps({**base, "per_request": {"new": per["new"]}}))
    got = ws.served(d, ["source", "structural", "new"], paths, "target", 3, False)
    assert got["per_request"]["new"] == per["new"] and got["per_request"]["source"] == per["source"]
    (d / "add-new" / "drift.json").write_text(json.dumps({**base, "cells": [{"hash": "sha256:2"}], "per_request": {"new": per["new"]}}))
    with pytest.raises(SystemExit, match="other prompts or settings"):
        ws.served(d, ["source", "structural", "new"], paths, "target", 3, False)


def test_arm_at_step_replaces_the_trained_tensors_and_nothing_else(tmp_path):
    """benchmarks/arm_at_step.py: the step-N drafter is the returned folder with the trained tensors of the step-N
    resume state (in the folder's dtype); every other tensor and the source folder are unchanged."""
    import torch

    from eagle_migrate import toy
    from eagle_migrate.formats import read_checkpoint
    from tests.layouts import write_layout

    mod = _bench("arm_at_step")
    cfg, sd = toy.drafter_config(), toy.drafter_state_dict("random")
    run = write_layout("vllm", cfg, sd, tmp_path / "run", dtype=torch.bfloat16)
    before = {n: read_checkpoint(run).tensor(n) for n in read_checkpoint(run).canonical_names()}
    trained = {"fc.weight": sd["fc.weight"] * 3 + 1, "norm.weight": sd["norm.weight"] * 0 + 2}
    torch.save({"step": 20, "params": trained}, tmp_path / "state-20.pt")
    done = mod.write_at_step(run, tmp_path / "state-20.pt", tmp_path / "step-20")
    assert sorted(done) == ["fc.weight", "norm.weight"]
    got = read_checkpoint(tmp_path / "step-20")
    for n, t in before.items():
        want = trained[n].to(torch.bfloat16) if n in trained else t
        assert got.tensor(n).dtype == torch.bfloat16 and torch.equal(got.tensor(n), want), n
    assert all(torch.equal(read_checkpoint(run).tensor(n), t) for n, t in before.items())  # the run is untouched
    torch.save({"step": 30, "params": {"nope.weight": sd["fc.weight"]}}, tmp_path / "state-30.pt")
    with pytest.raises(SystemExit, match="nope.weight"):
        mod.write_at_step(run, tmp_path / "state-30.pt", tmp_path / "step-30")
