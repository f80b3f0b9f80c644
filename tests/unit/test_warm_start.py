"""benchmarks/warm_start.py's comparison (issue 38): every arm against the source and each calibrated arm against its
control, paired per request, with the long buckets pooled; on synthetic per-request counters whose truth is known."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ws():
    spec = importlib.util.spec_from_file_location("warm_start", ROOT / "benchmarks" / "warm_start.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["warm_start"] = mod
    spec.loader.exec_module(mod)
    return mod


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
    }}
    out = ws.compare(drift, list(drift["per_request"]))
    assert set(out) == {*cells, "long"}  # the long buckets pooled
    assert set(out["chat"]) == {"structural / source", "cal-norms / source", "ctl-norms / source", "cal-norms / ctl-norms"}
    assert out["chat"]["structural / source"]["ratio"] == pytest.approx(1.0)
    better = out["long"]["cal-norms / source"]
    assert better["ratio"] > 1.1 and better["ratio"] - 2 * better["se"] > 1.0 and better["verdict"] == "improved"
    assert better["requests"] == 48 and out["chat"]["cal-norms / source"]["requests"] == 24
    ctl = out["long"]["cal-norms / ctl-norms"]
    assert ctl["ratio"] == pytest.approx(1.0) and ctl["verdict"] != "improved"
