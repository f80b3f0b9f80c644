"""benchmarks/served_al_table.py: the served AL's standard error from vLLM's per-position counters."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("served_al_table", ROOT / "benchmarks" / "served_al_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _counters(accepted: list[int], k: int = 3) -> dict:
    """vLLM's counters for drafts with these accepted counts (a prefix of the k drafts is accepted)."""
    return {"num_drafts": len(accepted), "accepted_per_position": [sum(a > j for a in accepted) for j in range(k)]}


def test_al_and_se_equal_the_per_draft_mean_and_standard_error():
    accepted = [0, 0, 1, 3, 2, 0, 1, 0, 0, 3, 1, 0]
    al, se, n = _module().al_se(_counters(accepted))
    assert n == len(accepted)
    assert math.isclose(al, 1 + statistics.mean(accepted))
    assert math.isclose(se, statistics.stdev(accepted) / math.sqrt(len(accepted)))


def test_table_rows_carry_new_and_baseline(tmp_path, capsys):
    rep = {"suites": [{"name": "chat", "new": _counters([1, 1, 0, 2]), "baseline": _counters([0, 0, 1, 0])}]}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(rep))
    t = _module().rows([("x", f)])
    assert math.isclose(t["x"]["chat"][0], 2.0) and math.isclose(t["baseline:x"]["chat"][0], 1.25)
