"""benchmarks/gpu/warm_start_gpu.py and arms_from_device.py (issue 38's GPU run): what comes back through the device
tool's file limits is every arm's trained tensors at the steps it keeps, the judge's choice always among them, and the
other side reads back exactly those tensors. (The whole run on the real pair, with the rebuilt drafters equal to the
device's own output tensor for tensor: tests/slow/test_gpu_drivers_smoke.py.)"""

from __future__ import annotations

import pytest
import torch

from .test_warm_start import _bench


@pytest.fixture(scope="module")
def ws():
    return _bench("gpu/warm_start_gpu")


@pytest.fixture(scope="module")
def back():
    return _bench("gpu/arms_from_device")


def test_thin_keeps_the_ends_and_the_judges_step_within_the_limit(ws):
    steps = [25, 50, 75, 100, 125, 150, 175, 200]
    assert ws.thin(steps, {75}, 10, 10_000) == steps  # all fit
    picked = ws.thin(steps, {75}, 10, 50)  # room for 4 sets beside the judge's choice
    assert len(picked) <= 4 and {25, 200, 75} <= set(picked)
    assert ws.thin(steps, {0}, 10, 30) == [25, 200]  # the initial weights (step 0) are not a saved step
    assert ws.thin([], {0}, 10, 30) == []


def test_pack_returns_what_the_other_side_reads(ws, back, tmp_path):
    arm_dir = tmp_path / "plain-cal"
    (arm_dir / "resume").mkdir(parents=True)
    arm = ws.Arm("plain-cal", proc=None, d=arm_dir)
    g = torch.Generator().manual_seed(0)
    for step in (25, 50, 75):
        arm.states[step] = {"fc.weight": torch.randn(6, 18, generator=g).to(torch.bfloat16),
                            "norm.weight": torch.rand(6, generator=g).to(torch.bfloat16)}
    arm.best, arm.best_step = dict(arm.states[50]), 50
    out = tmp_path / "out"
    out.mkdir()
    info = ws.pack(arm, out, limit=64 * 2**10 + 3 * 6 * 19 * 2)  # room for two steps beside the judge's
    assert info["steps_returned"] == [50, 75] or info["steps_returned"] == [25, 50]
    params, meta = back.arm_params(out / "plain-cal.safetensors")
    assert meta["best_step"] == "50" and "r_bar" not in meta  # no init/: not a 3.1 arm's conversion
    assert torch.equal(params["best"]["fc.weight"], arm.states[50]["fc.weight"])
    for s in info["steps_returned"]:
        for n, t in arm.states[s].items():
            assert torch.equal(params[str(s)][n], t) and params[str(s)][n].dtype == torch.bfloat16
