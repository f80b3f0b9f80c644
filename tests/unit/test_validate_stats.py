"""Standard errors and the paired comparison of offline `validate` (engines/metrics.py, validate/api.py): the
statistics on hand-computed cases, and the report's fields from a faked vLLM worker that counts per request."""

from __future__ import annotations

import json
import math

import pytest

from eagle_migrate import toy
from eagle_migrate.cli import main
from eagle_migrate.validate import validate
from eagle_migrate.engines import in_process as engine
from eagle_migrate.engines import vllm_engine
from eagle_migrate.engines.metrics import RequestCounts as R, cell_stats, paired_ratio, ratio_se, verdict

# three requests of very different difficulty; the new drafter accepts one more token than the baseline in each
BASE = [R(10, 5, [4, 1, 0]), R(10, 15, [7, 5, 3]), R(10, 25, [10, 8, 7])]
NEW = [R(10, 6, [4, 2, 0]), R(10, 16, [7, 5, 4]), R(10, 26, [10, 8, 8])]
# by hand: ratio = (78 / 30) / (75 / 30) = 1.04; z_i = T'_i / 78 - T_i / 75 = (16/78 - 15/75, 0, 36/78 - 35/75)
Z = 16 / 78 - 15 / 75
PAIRED_SE = 1.04 * math.sqrt(3 / 2 * 2 * Z * Z)


def test_cell_stats_hand_computed():
    st = cell_stats(NEW, 3)
    assert (st["requests"], st["drafts"], st["accepted"]) == (3, 30, 48) and st["al"] == pytest.approx(2.6)
    # residuals A_i - 1.6 D_i = -10, 0, 10
    assert st["al_se"] == pytest.approx(math.sqrt(3 / 2 * 200) / 30)
    assert st["per_position"] == pytest.approx([21 / 30, 15 / 30, 12 / 30])
    # position 0: 4, 7, 10 against r = 0.7: residuals -3, 0, 3
    assert st["per_position_se"][0] == pytest.approx(math.sqrt(3 / 2 * 18) / 30)
    one = cell_stats(NEW[:1], 3)
    assert one["al_se"] is None and one["per_position_se"] == [None] * 3  # one request: no SE, never a made-up one
    assert ratio_se([1.0], [2.0]) is None and ratio_se([0.0, 0.0], [0.0, 0.0]) is None


def test_paired_se_is_far_below_the_independent_ses():
    pr = paired_ratio(BASE, NEW)
    assert pr["ratio"] == pytest.approx(1.04) and pr["requests"] == 3
    assert pr["se"] == pytest.approx(PAIRED_SE)
    a, b = cell_stats(BASE, 3), cell_stats(NEW, 3)
    unpaired = pr["ratio"] * math.hypot(a["al_se"] / a["al"], b["al_se"] / b["al"])
    assert pr["se"] < unpaired / 20  # the pairing removes the between-request spread
    assert verdict(pr["ratio"], pr["se"]) == "improved"  # beyond 2 SE of 1.0 only because it is paired
    assert verdict(pr["ratio"], unpaired) == "within noise"
    assert paired_ratio(BASE[:1], NEW[:1])["se"] is None and paired_ratio([R(0, 0)] * 2, NEW[:2])["ratio"] is None
    with pytest.raises(ValueError, match="same requests"):
        paired_ratio(BASE, NEW[:2])


def test_verdict_rule():
    assert verdict(0.95, 0.02) == "worse" and verdict(1.05, 0.02) == "improved"
    assert verdict(0.97, 0.02) == "within noise" and verdict(1.0, 0.0) == "within noise"
    assert verdict(1.04, None) is None and verdict(None, 0.1) is None


# ----- the report, from a faked vLLM worker --------------------------------------------------------------------------
def fake_worker(missing: str | None = None):
    """vllm_worker's answer shape: the new drafter (``oracle`` folder) counts NEW, the baseline (``aux-only``) BASE,
    request by request; per-request counters only when the request asks for them (one left out for ``missing``)."""

    def run(request, python=None, timeout=0, **_):
        runs = []
        for r in request["runs"]:
            pat = NEW if r["drafter"].endswith("oracle") else BASE
            suites = {}
            for name, job in request["suites"].items():
                reqs = [pat[i % 3] for i in range(len(job["prompts"]))]
                res = {"num_drafts": sum(q.drafts for q in reqs), "num_draft_tokens": 3 * sum(q.drafts for q in reqs),
                       "num_accepted_tokens": sum(q.accepted for q in reqs),
                       "accepted_per_position": [sum(q.per_position[i] for q in reqs) for i in range(3)],
                       "num_prompts": len(reqs), "outputs": [[1, 2]] * len(reqs), "output_tokens": 2 * len(reqs),
                       "seconds": 0.1}
                if request.get("per_request_metrics"):
                    res["per_request"] = [q.counts() | {"num_draft_tokens": 3 * q.drafts} for q in reqs]
                    if missing and r["drafter"].endswith(missing):
                        res["per_request"][-1] = None
                suites[name] = res
            runs.append({"drafter": r["drafter"], "suites": suites})
        return {"ok": True, "vllm_version": "0.32.0", "runs": runs, "suites": runs[0]["suites"]}

    return run


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    return {"target": str(toy.write_target(root / "target")), "new": toy.write_drafter(root / "oracle", "oracle"),
            "base": toy.write_drafter(root / "aux-only", "aux-only")}


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(engine, "resolve_engine", lambda name, python: "vllm")

    def use(missing=None):
        monkeypatch.setattr(vllm_engine, "run_worker", fake_worker(missing))

    return use


def test_report_carries_ses_and_the_paired_ratio(world, faked, tmp_path):
    faked()
    rep = validate(world["new"], world["target"], engine="vllm", suites=["chat", "long"], baseline=world["base"],
                   num_prompts=3, max_tokens=8, diagnostics=False, max_regression_pct=-10.0, report_dir=tmp_path / "r")
    for s in rep.suites:
        assert s.prompt_set["size"] == 3
        assert s.new.acceptance_length == 2.6 and s.baseline.acceptance_length == 2.5 and s.regression_pct == -4.0
        assert s.new.acceptance_length_se == round(math.sqrt(300) / 30, 4)
        assert s.baseline.acceptance_length_se == round(math.sqrt(300) / 30, 4)
        assert s.new.per_position_rate_se[0] == round(math.sqrt(27) / 30, 4)
        p = s.paired
        assert (p.ratio, p.se, p.requests, p.verdict, p.note) == (1.04, round(PAIRED_SE, 4), 3, "improved", None)
    g = rep.suite("long").groups[0]
    assert g.paired.ratio == 1.04 and g.new.acceptance_length_se is not None
    o = rep.overall
    whole = paired_ratio(BASE * 2, NEW * 2)
    assert o["paired"]["requests"] == 6 and o["paired"]["se"] == round(whole["se"], 4) and o["new_se"] > 0
    # the gate keeps its meaning (regression -4 % > -10 % fails) and its message now carries the paired ratio
    assert not rep.passed and "regression -4.0% > -10.0%" in rep.failures[0]
    assert f"paired ratio 1.040 ± {PAIRED_SE:.3f} (improved)" in rep.failures[0]
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["suites"][0]["paired"]["verdict"] == "improved" and doc["overall"]["paired"]["ratio"] == 1.04
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"| 2.600 ± 0.577 | 2.500 ± 0.577 | -4.0 | 1.040 ± {PAIRED_SE:.3f} (improved) |" in md
    from eagle_migrate.validate.plots import plot_acceptance

    bars = [c for c in plot_acceptance(rep).axes[0].containers if getattr(c, "errorbar", None) is not None]
    lo, hi = bars[0].errorbar.lines[2][0].get_segments()[0]  # the new drafter's chat bar: +-1 SE whisker
    assert hi[1] - lo[1] == pytest.approx(2 * rep.suites[0].new.acceptance_length_se) and len(bars) == 2


def test_unpaired_when_a_request_lacks_its_counters(world, faked):
    faked(missing="aux-only")
    logs: list[str] = []
    rep = validate(world["new"], world["target"], engine="vllm", suites=["chat"], baseline=world["base"],
                   num_prompts=3, max_tokens=8, diagnostics=False, log=logs.append)
    s = rep.suite("chat")
    assert s.new.acceptance_length_se is not None and s.baseline.acceptance_length_se is None
    assert s.paired.ratio is None and s.paired.verdict is None and "2 of 3 requests" in s.paired.note
    assert any("paired comparison: not paired" in m for m in logs)  # said, not silently dropped
    assert s.regression_pct == -4.0  # the totals and the gate's number are unchanged


def test_cli_prints_al_se_and_the_paired_verdict(world, faked, capsys):
    faked()
    args = ["validate", str(world["new"]), "--target", world["target"], "--engine", "vllm", "--suite", "chat",
            "--num-prompts", "3", "--max-tokens", "8", "--baseline", str(world["base"]), "--no-diagnostics"]
    with pytest.raises(SystemExit) as e:
        main(args)
    out, _ = capsys.readouterr()
    assert e.value.code in (0, None)
    assert f"chat: AL 2.600 ± 0.577 vs baseline 2.500 ± 0.577; paired ratio 1.040 ± {PAIRED_SE:.3f} (improved)" in out
    with pytest.raises(SystemExit):
        main(args + ["--json"])
    out, _ = capsys.readouterr()
    doc = json.loads(out)  # still exactly one JSON document
    assert doc["suites"][0]["paired"]["ratio"] == 1.04


def test_the_worker_asks_for_per_request_metrics_only_where_vllm_has_them(monkeypatch):
    """An older vLLM without ``per_request_spec_decode_metrics`` still builds its engine (validate then reports no SE,
    saying why) instead of failing on an unknown engine argument."""
    pytest.importorskip("vllm")
    from eagle_migrate.engines import vllm_worker as w

    req = {"target": "t", "per_request_metrics": True}
    assert w.engine_arg_exists("per_request_spec_decode_metrics") and not w.engine_arg_exists("no_such_argument")
    assert w._engine_kwargs(req, "d", 3)["per_request_spec_decode_metrics"] == "summary"
    assert "per_request_spec_decode_metrics" not in w._engine_kwargs(req, None, 3)  # the target alone: nothing to count
    monkeypatch.setattr(w, "engine_arg_exists", lambda name: False)  # as on an older vLLM
    assert "per_request_spec_decode_metrics" not in w._engine_kwargs(req, "d", 3)
