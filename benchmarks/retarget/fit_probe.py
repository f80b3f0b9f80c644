"""A probe of another fit measure (issue 50): on B's own text, where A's and B's greedy next tokens differ, does the
drafter's step 0 propose A's token (it drafts what A would write: stale) or B's? target_fit.py's step-0 agreement on
B's text against A's text mixes in how predictable each text is; this compares the two targets on the same positions.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/retarget/fit_probe.py B A N_SEQUENCES NAME=DRAFTER [NAME=DRAFTER ...]
    .venv/bin/python benchmarks/retarget/fit_probe.py --summary FILE.jsonl
    .venv/bin/python benchmarks/retarget/fit_probe.py --simulate-looks

Every drafter is scored on the same positions (B's sequences and both targets' forwards are made once): paired.
Prints one JSON line per drafter: the drafted positions of B's own sequences (own_text.measurement_sequences, as
target_fit), those where A's greedy token differs from B's, the drafter's top-1 hits on B's and on A's token, overall
and there, and the per-sequence counts (``rows``). ``--summary`` reads those lines back: A's share where the targets
differ, on_diff_A / (on_diff_A + on_diff_B), with its standard error clustered by sequence (a ratio estimator), and
each drafter's share against the first one's, paired by sequence, and target_fit.follows' early stop replayed on them.
``--simulate-looks``: how often that early stop's looks find an even share 3 SE from even (its false-decision rate).
"""
import json
import math
import random
import sys

import torch

from eagle_migrate.aux_evidence import Step0, target_states
from eagle_migrate.engines.metrics import ratio_se
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.loader import load_drafter
from eagle_migrate.own_text import drafted_positions, measurement_sequences
from eagle_migrate.target import LazyTarget
from eagle_migrate.target_fit import (FOLLOW_FIRST_LOOK, FOLLOW_LOOK_EVERY, FOLLOW_MIN_POSITIONS,
                                      FOLLOW_SEQUENCES)


def _ratio(num: list[int], den: list[int]) -> tuple[float, float]:
    """sum(num) / sum(den) and its SE with each sequence a cluster (eagle_migrate.engines.metrics.ratio_se, as
    target_fit uses)."""
    return sum(num) / sum(den), ratio_se([float(x) for x in num], [float(x) for x in den])


def share(rows: list[dict]) -> tuple[float, float]:
    """A's share of the drafter's hits where the targets differ, and its SE with each sequence a cluster."""
    return _ratio([r["on_diff_A"] for r in rows], [r["on_diff_A"] + r["on_diff_B"] for r in rows])


def paired(rows: list[dict], base: list[dict]) -> tuple[float, float]:
    """share(rows) - share(base) over the same sequences, SE by the delta method with each sequence a cluster."""
    p1, _ = share(rows)
    p0, _ = share(base)
    n1 = sum(r["on_diff_A"] + r["on_diff_B"] for r in rows)
    n0 = sum(r["on_diff_A"] + r["on_diff_B"] for r in base)
    m = len(rows)
    z = [(r["on_diff_A"] - p1 * (r["on_diff_A"] + r["on_diff_B"])) / n1
         - (b["on_diff_A"] - p0 * (b["on_diff_A"] + b["on_diff_B"])) / n0 for r, b in zip(rows, base)]
    return p1 - p0, math.sqrt(m / (m - 1) * sum(x * x for x in z))


def rank_share(rows: list[dict]) -> tuple[float, float]:
    """The share of the positions where the targets differ at which the drafter ranks A's token above B's, SE
    clustered by sequence."""
    return _ratio([r["prefers_A"] for r in rows], [r["ranked"] for r in rows])


def summary(path: str) -> None:
    """The tables of a file of probe lines, one block per B (the first drafter of each B is the paired base)."""
    recs = [json.loads(ln) for ln in open(path) if ln.strip()]
    for b in dict.fromkeys(r["B"] for r in recs):
        print(f"B = {b}\n")
        _summary([r for r in recs if r["B"] == b])
        print()


def _summary(recs: list[dict]) -> None:
    base = recs[0]
    print("| drafter | sequences | drafted | A and B differ | proposes B's | proposes A's | A's share | vs "
          f"{base['name']} (paired) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in recs:
        p, se = share(r["rows"])
        d = "-" if r is base else "{:+.3f} +- {:.3f}".format(*paired(r["rows"], base["rows"]))
        print(f"| {r['name']} | {r['sequences']} | {r['drafted']} | {r['differ']} | {r['on_diff_B']} | "
              f"{r['on_diff_A']} | {p:.3f} +- {se:.3f} ({(p - 0.5) / se:+.1f} SE from even) | {d} |")
    _looks(recs)
    if "prefers_A" not in base["rows"][0]:
        return
    print()
    # the ranking variant: a token outside the draft vocabulary ranks last, a tie counts as not A's
    print("| drafter | positions ranked | ranks A's token above B's | share | from even |")
    print("|---|---|---|---|---|")
    for r in recs:
        p, se = rank_share(r["rows"])
        print(f"| {r['name']} | {r['ranked']} | {r['prefers_A']} | {p:.3f} +- {se:.3f} | {(p - 0.5) / se:+.1f} SE |")


def _looks(recs: list[dict]) -> None:
    """target_fit.follows' early stop replayed on the recorded sequences (the same ones, in the same order): the share
    and its distance from even at each look, and where the rule stops."""
    print()
    print("| drafter | the looks (sequences: share +- SE, SE from even) | stops at |")
    print("|---|---|---|")
    for r in recs:
        cells, stop = [], "-"
        for g in range(FOLLOW_FIRST_LOOK, len(r["rows"]) + 1, FOLLOW_LOOK_EVERY):
            rows = r["rows"][:g]
            p, se = share(rows)
            cells.append(f"{g}: {p:.3f} +- {se:.3f} ({(p - 0.5) / se:+.1f})")
            n = sum(x["on_diff_A"] + x["on_diff_B"] for x in rows)
            if stop == "-" and n >= FOLLOW_MIN_POSITIONS and abs(p - 0.5) > 3 * se:
                stop = f"{g} ({'stale' if p > 0.5 else 'follows B'})"
        print(f"| {r['name']} | {' / '.join(cells)} | {stop} |")


def simulate_looks(trials: int = 20000, seed: int = 1) -> float:
    """How often an even share crosses 3 SE at one of follows' looks (64, 96, ..., 256 sequences): each sequence an
    independent standard normal contribution of equal weight (an approximation: the real clusters differ in size)."""
    looks = list(range(FOLLOW_FIRST_LOOK, FOLLOW_SEQUENCES + 1, FOLLOW_LOOK_EVERY))
    rng, hit = random.Random(seed), 0
    for _ in range(trials):
        total, n = 0.0, 0
        for look in looks:
            while n < look:
                total, n = total + rng.gauss(0, 1), n + 1
            if abs(total / math.sqrt(n)) > 3:
                hit += 1
                break
    return hit / trials


def main() -> None:
    B, A = sys.argv[1:3]
    n_seq = int(sys.argv[3])
    named = [a.split("=", 1) for a in sys.argv[4:]]
    tb = LazyTarget(B, "cpu", torch.float32)
    ta = LazyTarget(A, "cpu", torch.float32)
    drafters = []
    for name, path in named:
        ck = read_checkpoint(path)
        m = load_drafter(ck, tb.loaded, device="cpu", dtype=torch.float32)
        drafters.append((name, list(ck.config.aux_layer_ids), Step0(m, tb.info.vocab_size, "cpu", torch.float32)))
    layers = sorted({i for _, ids, _ in drafters for i in ids})
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in drafters}
    for h in measurement_sequences(tb, None, 0, None, 512):
        sb, nb = target_states(tb, h.ids, layers)
        _, na = target_states(ta, h.ids, layers)
        drafted = drafted_positions(h, nb)
        for name, ids, step in drafters:
            aux = torch.cat([sb[j] for j in sorted(ids)], dim=-1)[: len(h.ids) - 1]
            logits = step.logits(aux, h.ids)
            prop = step.m.to_target_ids(logits.argmax(-1)).cpu()  # [T-1]: what vLLM proposes first
            wb, wa = nb[1:][: len(prop)], na[1:][: len(prop)]
            # position i proposes the token after ids[i+1]: compare with the targets' greedy next token there
            d = drafted[: len(prop)]
            diff = d & (wa != wb)
            # the drafter's ranking of the two tokens at every position where they differ (a token outside the
            # draft vocabulary ranks last): more positions than the top-1 hits
            lp = torch.log_softmax(logits, -1).cpu()
            da, db = step.t2d[wa], step.t2d[wb]
            la = torch.where(da >= 0, lp.gather(1, da.clamp_min(0).unsqueeze(1)).squeeze(1), torch.tensor(-1e9))
            lb = torch.where(db >= 0, lp.gather(1, db.clamp_min(0).unsqueeze(1)).squeeze(1), torch.tensor(-1e9))
            ranked = diff & ((da >= 0) | (db >= 0))
            rows[name].append({"drafted": int(d.sum()), "differ": int(diff.sum()), "hit_B": int((prop == wb)[d].sum()),
                               "hit_A": int((prop == wa)[d].sum()), "on_diff_B": int((prop == wb)[diff].sum()),
                               "on_diff_A": int((prop == wa)[diff].sum()), "ranked": int(ranked.sum()),
                               "prefers_A": int((la > lb)[ranked].sum())})
        done = len(rows[named[0][0]])
        if done % 16 == 0:
            print(f"fit_probe: {done}/{n_seq} sequences", file=sys.stderr, flush=True)
        if done >= n_seq:
            break
    for name, path in named:
        rs = rows[name]
        tot = {k: sum(r[k] for r in rs) for k in rs[0]}
        print(json.dumps({"name": name, "drafter": path, "B": B, "A": A, "sequences": len(rs), **tot, "rows": rs}),
              flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    elif sys.argv[1] == "--simulate-looks":
        print(f"an even share crosses 3 SE at one of the looks: {simulate_looks():.4f} of 20,000 trials")
    else:
        main()
