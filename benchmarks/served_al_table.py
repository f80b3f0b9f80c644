"""Served acceptance length with standard errors, from `eagle-migrate validate --json` reports (vLLM's counters).

vLLM counts, per suite, the drafts n and the drafts accepted at each draft position j (accepted_per_position[j]).
A draft's accepted tokens are a prefix, so the number of drafts with at least j accepted is accepted_per_position[j-1]
and the distribution of a (accepted tokens per draft) follows exactly: E[a] = sum_j A_j / n,
E[a^2] = sum_j (2j - 1) A_j / n. AL = 1 + E[a], se(AL) = sd(a) / sqrt(n) (drafts as the units, as the judge's
``acceptance_length_se``). Two drafters served on the same prompts are compared unpaired here
(se = sqrt(se_a^2 + se_b^2)): greedy serving visits different positions with different drafters, so vLLM's counters
cannot be paired; on the same prompts the two ALs are positively correlated and this standard error is conservative.
The paired difference over the same positions is the judge's (convert's report, ``calibration.details.judge``).

    python benchmarks/served_al_table.py NAME=validate.json [NAME=validate.json ...] [--source NAME]

Each report contributes its ``new`` drafter under NAME and its ``baseline`` (if any) under ``baseline:NAME``;
``--source`` names the row the ratios are taken against (default: the first report's baseline).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def al_se(m: dict) -> tuple[float, float, int]:
    """(AL, se, drafts) of one Metrics block of a validate report."""
    n = int(m["num_drafts"])
    acc = [int(x) for x in m["accepted_per_position"]]
    if n == 0:
        return 1.0, float("nan"), 0
    ea = sum(acc) / n
    ea2 = sum((2 * j + 1) * a for j, a in enumerate(acc)) / n
    var = max(ea2 - ea * ea, 0.0) * n / max(n - 1, 1)
    return 1.0 + ea, math.sqrt(var / n), n


def rows(named: list[tuple[str, Path]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for name, p in named:
        r = json.loads(p.read_text())
        for s in r["suites"]:
            out.setdefault(name, {})[s["name"]] = al_se(s["new"])
            if s.get("baseline"):
                out.setdefault(f"baseline:{name}", {})[s["name"]] = al_se(s["baseline"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", help="NAME=path/to/validate.json")
    ap.add_argument("--source", default=None, help="row the ratios are against (default: the first report's baseline)")
    a = ap.parse_args()
    named = [(x.split("=", 1)[0], Path(x.split("=", 1)[1])) for x in a.reports]
    t = rows(named)
    src = a.source or f"baseline:{named[0][0]}"
    suites = sorted({s for v in t.values() for s in v}, key=["chat", "template-shift", "long", "code"].index)
    print("| drafter | " + " | ".join(f"{s} AL +/- se (drafts) | {s} vs source +/- se" for s in suites) + " |")
    print("|---|" + "---|---|" * len(suites))
    for name, v in t.items():
        cells = []
        for s in suites:
            if s not in v:
                cells += ["–", "–"]
                continue
            al, se, n = v[s]
            cells.append(f"{al:.3f} +/- {se:.3f} ({n})")
            if src in t and s in t[src] and name != src:
                bal, bse, _ = t[src][s]
                r = al / bal
                cells.append(f"{r:.3f} +/- {r * math.hypot(se / al, bse / bal):.3f} (diff {al - bal:+.3f} +/- {math.hypot(se, bse):.3f})")
            else:
                cells.append("1" if name == src else "–")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
