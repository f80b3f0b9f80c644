"""quantize's acceptance gate report: each AL with its standard error and the paired ratio AL(after) / AL(before)
with its SE and verdict, per suite and pooled, the request as the unit; no SE (and a note saying why) when the
engine's per-request counters are missing or do not add up. The gate's pass / fail stays the percentage drop.

Pure: engine results are built by hand (``{suite: (AcceptanceStats, {"per_request": [...]})}``)."""

from __future__ import annotations

import math

import pytest

from eagle_migrate.quantize.gate import acceptance_report, paired_words
from eagle_migrate.engines.metrics import AcceptanceStats, RequestCounts, paired_ratio


def result(reqs: list[tuple[int, int]], *, per_request: bool = True, counted: int | None = None):
    """One suite's engine result from (drafts, accepted) per request; ``counted``: per-request counters for only the
    first ``counted`` requests (the others null, as a vLLM without per-request metrics returns)."""
    stats = AcceptanceStats(num_drafts=sum(d for d, _ in reqs), num_draft_tokens=3 * sum(d for d, _ in reqs),
                            num_accepted_tokens=sum(a for _, a in reqs), num_prompts=len(reqs))
    if not per_request:
        return stats, {}
    pr = [{"num_drafts": d, "num_accepted_tokens": a, "accepted_per_position": []} for d, a in reqs]
    if counted is not None:
        pr = pr[:counted] + [None] * (len(pr) - counted)
    return stats, {"per_request": pr}


def cluster_se(reqs: list[tuple[int, int]]) -> float:
    """The AL's SE with each request a cluster, written out here (docs/validate.md)."""
    n, d = len(reqs), sum(x for x, _ in reqs)
    r = sum(a for _, a in reqs) / d
    return math.sqrt(n / (n - 1) * sum((a - r * x) ** 2 for x, a in reqs)) / d


BEFORE = {"chat": [(10, 30), (12, 33), (8, 22), (10, 28)], "code": [(9, 27), (11, 31), (10, 29)]}
# every request loses about a quarter of its accepted tokens: clearly worse, far beyond the paired noise
AFTER = {"chat": [(13, 26), (15, 30), (10, 19), (13, 25)], "code": [(12, 24), (14, 28), (13, 26)]}


def test_each_al_has_its_se_and_the_paired_ratio_is_worse_beyond_noise():
    rep = acceptance_report("vllm", 3, {n: result(r) for n, r in BEFORE.items()},
                            {n: result(r) for n, r in AFTER.items()}, max_drop=30.0)
    for name in BEFORE:
        s = rep.suites[name]
        assert s.before_se == pytest.approx(cluster_se(BEFORE[name]), abs=1e-4)
        assert s.after_se == pytest.approx(cluster_se(AFTER[name]), abs=1e-4)
        assert s.paired.requests == len(BEFORE[name]) and s.paired.note is None
        assert s.paired.ratio == pytest.approx(s.after / s.before, abs=1e-4)
        assert s.paired.verdict == "worse" and s.drop_beyond_noise is True
    # pooled: every suite's requests together (not an average of the suites' SEs)
    pooled_b, pooled_a = BEFORE["chat"] + BEFORE["code"], AFTER["chat"] + AFTER["code"]
    assert rep.before_se == pytest.approx(cluster_se(pooled_b), abs=1e-4)
    assert rep.after_se == pytest.approx(cluster_se(pooled_a), abs=1e-4)
    pr = paired_ratio([RequestCounts(d, a) for d, a in pooled_b], [RequestCounts(d, a) for d, a in pooled_a])
    assert rep.paired.ratio == pytest.approx(pr["ratio"], abs=1e-4) and rep.paired.se == pytest.approx(pr["se"], abs=1e-4)
    assert rep.paired.requests == 7 and rep.paired.verdict == "worse" and rep.drop_beyond_noise is True
    assert rep.paired.ratio == pytest.approx(1 - rep.drop_pct / 100, abs=1e-4)  # the same change, two ways
    # the gate is still the percentage drop against --max-al-drop: a worse-beyond-noise drop within 30 % passes
    assert rep.drop_pct < 30.0 and rep.passed is True
    assert f"paired ratio {rep.paired.ratio:.3f} ± {rep.paired.se:.3f} (worse, beyond 2 SE)" == rep.paired_text()
    dumped = rep.model_dump(mode="json")  # what quantize --json and provenance.json carry
    assert dumped["paired"]["verdict"] == "worse" and dumped["suites"]["chat"]["before_se"] == rep.suites["chat"].before_se


def test_a_drop_over_the_gate_can_be_within_noise():
    """Requests that disagree (one better, one much worse) give a large drop with a large paired SE: the gate fails
    on the point estimate and the report says the drop is within noise."""
    before = {"toy": result([(10, 20), (10, 20), (10, 20)])}
    after = {"toy": result([(10, 28), (10, 2), (10, 20)])}
    rep = acceptance_report("reference", 3, before, after, max_drop=5.0)
    assert rep.drop_pct > 5.0 and rep.passed is False
    assert rep.paired.verdict == "within noise" and rep.drop_beyond_noise is False
    assert rep.paired_text().endswith("(within noise)")


def test_missing_per_request_counters_give_no_se_and_say_why():
    before = {"chat": result(BEFORE["chat"]), "code": result(BEFORE["code"])}
    after = {"chat": result(AFTER["chat"], counted=2), "code": result(AFTER["code"])}
    rep = acceptance_report("vllm", 3, before, after, max_drop=None)
    assert rep.suites["chat"].after_se is None and rep.suites["chat"].paired.ratio is None
    assert rep.suites["chat"].paired.note == "not paired: chat: per-request counters for 2 of 4 requests"
    assert rep.suites["chat"].drop_beyond_noise is None and rep.suites["chat"].before_se is not None
    assert rep.suites["code"].paired.verdict == "worse"  # the other suite is counted fully
    assert rep.after_se is None and rep.paired.note.startswith("not paired: chat: per-request counters for 2 of 4")
    assert rep.drop_beyond_noise is None and "not paired" in rep.paired_text()
    assert rep.passed is None and rep.drop_pct > 0  # the point estimates are still there

    none = acceptance_report("vllm", 3, {"chat": result(BEFORE["chat"], per_request=False)},
                             {"chat": result(AFTER["chat"], per_request=False)}, max_drop=1.0)
    assert none.before_se is None and none.after_se is None and none.paired.ratio is None
    assert none.paired.note == "not paired: the engine returned no per-request counters"
    assert none.passed is False and paired_words(none.paired) == "paired ratio n/a (not paired: the engine returned no per-request counters)"


def test_per_request_counters_that_disagree_with_the_totals_give_no_se():
    stats, extra = result(BEFORE["chat"])
    extra["per_request"][0]["num_accepted_tokens"] += 1  # no longer sums to the engine's total
    rep = acceptance_report("vllm", 3, {"chat": (stats, extra)}, {"chat": result(AFTER["chat"])}, max_drop=None)
    assert rep.suites["chat"].before_se is None and rep.before_se is None and rep.paired.ratio is None
    assert "disagree with the engine's totals" in rep.paired.note


def test_one_request_has_a_ratio_but_no_se_and_no_verdict():
    rep = acceptance_report("vllm", 3, {"toy": result([(10, 30)])}, {"toy": result([(10, 10)])}, max_drop=None)
    assert rep.before_se is None and rep.paired.ratio == pytest.approx(2.0 / 4.0)
    assert rep.paired.se is None and rep.paired.verdict is None and rep.paired.note == "fewer than 2 requests"
    assert rep.drop_beyond_noise is None and "no SE: fewer than 2 requests" in rep.paired_text()
