"""benchmarks/drift_curve.py: its standard errors cover the truth as often as they claim, the paired ratio is paired,
and the command writes the table, the plot and the fixed prompt hashes end to end (reference engine, toy world)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dc():
    spec = importlib.util.spec_from_file_location("drift_curve", ROOT / "benchmarks" / "drift_curve.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["drift_curve"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def offline_sets(monkeypatch):
    """Prompt sets must not depend on what happens to be cached on this machine (ShareGPT, HumanEval)."""
    from eagle_migrate import corpora

    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: None)
    monkeypatch.setattr(corpora.sources, "humaneval_file", lambda fetch=False: None)


def _request(rng: random.Random, p: float, k: int, steps: int, js: list[int] | None = None):
    """One request of ``steps`` drafts, each accepting a prefix: position i accepted w.p. p (given i-1 was)."""
    from drift_curve import Req

    acc, pos = 0, [0] * k
    for _ in range(steps):
        j = 0
        while j < k and rng.random() < p:
            pos[j] += 1
            j += 1
        acc += j
        if js is not None:
            js.append(j)
    return Req(steps, acc, pos)


def test_cell_stats_counts_and_hand_computed_se(dc):
    reqs = [dc.Req(4, 6, [3, 2, 1]), dc.Req(2, 0, [0, 0, 0]), dc.Req(6, 3, [2, 1, 0])]
    st = dc.cell_stats(reqs, 3)
    assert (st["requests"], st["drafts"], st["accepted"]) == (3, 12, 9)
    assert st["al"] == pytest.approx(1.75) and st["per_position"] == pytest.approx([5 / 12, 3 / 12, 1 / 12])
    r = 9 / 12  # residuals A_i - r D_i = 3, -1.5, -1.5
    assert st["al_se"] == pytest.approx(math.sqrt(3 / 2 * (9 + 2.25 + 2.25)) / 12)
    assert r == st["al"] - 1
    assert dc.cell_stats(reqs[:1], 3)["al_se"] is None  # one request: no SE, never a made-up one
    # every request at the same rate: no between-request spread, SE 0
    assert dc.cell_stats([dc.Req(5, 10, [5, 3, 2]), dc.Req(3, 6, [3, 2, 1])], 3)["al_se"] == 0.0


def test_se_covers_the_true_al_and_the_true_ratio(dc):
    """+-2 SE intervals cover the true AL and the true paired ratio in about 95 % of simulated cells whose requests
    differ in difficulty; the SE that treats drafts as independent (no clustering by request) covers far less."""
    rng = random.Random(0)
    k, ps, lift = 3, (0.2, 0.5, 0.8), 0.1

    def f(p: float) -> float:  # expected accepted tokens per draft
        return sum(p ** (i + 1) for i in range(k))

    true_al = 1 + sum(f(p) for p in ps) / len(ps)  # steps are drawn independently of p
    true_ratio = (1 + sum(f(p + lift) for p in ps) / len(ps)) / true_al
    cover = cover_naive = cover_ratio = 0
    trials = 300
    for _ in range(trials):
        src, new, js = [], [], []
        for _ in range(16):
            p, steps = rng.choice(ps), rng.randint(10, 40)
            src.append(_request(rng, p, k, steps, js))
            new.append(_request(rng, p + lift, k, steps))
        st = dc.cell_stats(src, k)
        cover += abs(st["al"] - true_al) <= 2 * st["al_se"]
        mean_j = sum(js) / len(js)
        naive_se = math.sqrt(sum((j - mean_j) ** 2 for j in js) / (len(js) - 1) / len(js))
        cover_naive += abs(st["al"] - true_al) <= 2 * naive_se
        pr = dc.paired_ratio(src, new)
        cover_ratio += abs(pr["ratio"] - true_ratio) <= 2 * pr["se"]
    assert 0.88 <= cover / trials <= 0.99
    assert 0.88 <= cover_ratio / trials <= 0.99
    assert cover_naive / trials < cover / trials - 0.15


def test_paired_ratio_is_paired_and_exact_on_identical_drafters(dc):
    rng = random.Random(1)
    src = [_request(rng, rng.uniform(0.2, 0.8), 3, rng.randint(5, 30)) for _ in range(10)]
    same = dc.paired_ratio(src, src)
    assert same["ratio"] == pytest.approx(1.0) and same["se"] == pytest.approx(0.0, abs=1e-12)
    # a drafter that accepts one token more on every draft of every request: the ratio moves, and its SE is far
    # smaller than two unpaired SEs combined would be (the prompts' difficulty cancels)
    better = [dc.Req(r.drafts, r.accepted + r.drafts, r.per_position) for r in src]
    pr = dc.paired_ratio(src, better)
    a, b = dc.cell_stats(src, 3), dc.cell_stats(better, 3)
    assert pr["ratio"] == pytest.approx(b["al"] / a["al"])
    unpaired = pr["ratio"] * math.hypot(a["al_se"] / a["al"], b["al_se"] / b["al"])
    assert pr["se"] < 0.5 * unpaired
    with pytest.raises(ValueError):
        dc.paired_ratio(src, src[:-1])


def test_goal_and_beyond_2se_flags(dc):
    src = [dc.Req(10, 5, [4, 1, 0]), dc.Req(10, 4, [3, 1, 0]), dc.Req(10, 6, [4, 2, 0])]
    up = [dc.Req(10, 15, [8, 5, 2]), dc.Req(10, 14, [8, 4, 2]), dc.Req(10, 16, [8, 5, 3])]
    stats = dc.analyse(["src", "up"], {"src": {"chat": src, "long/4k": src}, "up": {"chat": up, "long/4k": src}}, 3,
                       goals={"chat": 1.5, "long/4k": 1.15})
    chat, long4 = stats["drafters"]["up"]["chat"], stats["drafters"]["up"]["long/4k"]
    assert chat["ratio"] == pytest.approx((1 + 45 / 30) / (1 + 15 / 30)) and chat["ratio_beyond_2se"]
    assert chat["goal"]["met"] and chat["goal"]["ratio_minus_2se"] == pytest.approx(chat["ratio"] - 2 * chat["ratio_se"])
    assert long4["ratio"] == pytest.approx(1.0) and not long4["ratio_beyond_2se"] and not long4["goal"]["met"]
    assert "ratio" not in stats["drafters"]["src"]["chat"]


def test_end_to_end_reference_engine_on_the_toy_world(dc, toy_target, toy_oracle, toy_aux_only, toy_random, tmp_path):
    out = tmp_path / "drift"
    kw = dict(engine="reference", k=3, chat=2, shift_requests=1, long_per_bucket=3, buckets=(256, 512),
              max_tokens=12, long_max_tokens=12, log=lambda m: None)
    drafters = [("oracle", str(toy_oracle)), ("aux-only", str(toy_aux_only)), ("random", str(toy_random))]
    res = dc.run(drafters, str(toy_target), out, **kw)
    doc = json.loads((out / "drift.json").read_text())
    assert doc["stats"] == json.loads(json.dumps(res["stats"]))
    cells = doc["stats"]["cells"]
    assert cells == ["chat", "template-shift", "long/256", "long/512"]
    for c in doc["cells"]:
        assert c["hash"].startswith("sha256:") and len(c["prompt_lengths"]) == c["size"]
    shift = doc["cells"][1]  # one request under each template variant that fits the toy's 1k context
    assert len(set(shift["groups"])) == shift["size"] >= 6
    kinds = {src.split(":")[0] for src in doc["cells"][2]["sources"]}
    assert kinds == {"pydoc", "stdlib", "builtin-packed"}  # one prompt of each kind per bucket (3 per bucket)
    oracle, aux, rnd = (doc["stats"]["drafters"][x] for x in ("oracle", "aux-only", "random"))
    for c in cells:  # the toy world's known answers: oracle k + 1, aux-only exactly 2, on every request
        assert oracle[c]["al"] == 4.0 and oracle[c]["per_position"] == [1.0, 1.0, 1.0] and oracle[c]["al_se"] == 0.0
        assert aux[c]["al"] == 2.0 and aux[c]["ratio"] == pytest.approx(0.5) and aux[c]["ratio_se"] == pytest.approx(0.0)
        assert aux[c]["ratio_beyond_2se"] and aux[c]["requests"] == oracle[c]["requests"]
        assert rnd[c]["ratio"] == pytest.approx(rnd[c]["al"] / 4.0)
        n = len(doc["per_request"]["random"][c])
        assert n == doc["cells"][cells.index(c)]["size"] and sum(
            r["num_drafts"] for r in doc["per_request"]["random"][c]) == rnd[c]["drafts"]
    md = (out / "drift.md").read_text()
    assert "| aux-only | 0.500 ± 0.000 *" in md and "`" + doc["cells"][0]["hash"] + "`" in md
    assert (out / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from eagle_migrate.errors import InputError, OutputExistsError

    with pytest.raises(OutputExistsError):  # never overwrites without force
        dc.run(drafters[:1], str(toy_target), out, **kw)
    # the same prompts are demanded from a later run: another seed is refused before anything is measured
    with pytest.raises(InputError, match="prompt sets differ"):
        dc.run(drafters[:1], str(toy_target), tmp_path / "again", hashes_from=out / "drift.json", **{**kw, "k": 3}, seed=1)
