"""The GPU benchmark harness runs on a CPU with its small shape, so it cannot rot between GPU sessions: the tokens it
counts are the positions it trained, and the end-to-end mode accounts for the whole calibrate() call."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("calibrate_throughput", ROOT / "benchmarks" / "calibrate_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate_throughput"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_throughput_counts_the_trained_positions(bench):
    r = bench.run_one("small", "norms+fc", torch.device("cpu"), batch=2, seq_len=32, k=2, steps=3, warmup_steps=1)
    assert r["tokens_per_s"] > 0 and r["peak_gib"] is None
    # 3 timed steps x 2 sequences x 31 positions whose next token is trained
    assert r["tokens_per_s"] * r["ms_per_step"] * r["timed_steps"] / 1e3 == pytest.approx(3 * 2 * 31)
    assert r["trainable_params"] > 256 * 256 * 3  # fc is in norms+fc


def test_end_to_end_accounts_for_the_calibrate_call(bench):
    r = bench.end_to_end("small", torch.device("cpu"), steps=2, num_sequences=4, heldout=3)
    assert r["steps_run"] == 2 and r["tokens_seen"] > 0
    assert set(r["phases_s"]) >= {"held-out continuations + features", "held-out evaluations", "train steps"}
    assert sum(r["phases_s"].values()) == pytest.approx(r["calibrate_s"], rel=0.05)
