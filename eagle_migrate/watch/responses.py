"""``watch --responses FILE``: the per-request acceptance histogram of each window, where the deployment gives it.

vLLM's ``/metrics`` has pooled counters only; per-request acceptance comes back in each response, under
``metrics.speculative_decoding``, when the server runs with ``--per-request-spec-decode-metrics summary|detailed``
(vLLM >= 0.32). ``watch`` sends no traffic, so it reads those where the deployment keeps them: a JSONL file that a
gateway or client appends the responses (or just their ``speculative_decoding`` objects) to. Each window reads the
lines appended since the last one (:class:`ResponsesTail`; a file that shrank was rotated and is read from its start)
and counts the requests, how many fell below the floor (``--min-al``), the histogram of their ALs (buckets of 0.5
from 1 to k + 1) and their summed histogram of accepted tokens per draft (:func:`per_request_window`).
Imports: errors, watch.models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from .models import PerRequestWindow


def spec_of(obj: Any) -> dict[str, Any] | None:
    """The per-request spec-decode metrics in a logged line: a whole response, ``{"speculative_decoding": ...}``,
    or the object itself; None when the line has none."""
    if not isinstance(obj, dict):
        return None
    m = obj.get("metrics")
    for cand in ((m or {}).get("speculative_decoding") if isinstance(m, dict) else None,
                 obj.get("speculative_decoding"), obj):
        if isinstance(cand, dict) and isinstance(cand.get("acceptance_histogram"), list):
            return cand
    return None


class ResponsesTail:
    """The lines appended to ``path`` since the last :meth:`read` (the watch starts at its current end)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"--responses {self.path}: no such file",
                             "pass the JSONL file your gateway appends the server's responses to (it may be empty)")
        self.offset = self.path.stat().st_size

    def read(self) -> tuple[list[dict[str, Any]], int]:
        """(the per-request metrics of the new complete lines, how many new lines carried none)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return [], 0
        if size < self.offset:  # rotated or truncated
            self.offset = 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next window
        self.offset += end
        specs, skipped = [], 0
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                s = spec_of(json.loads(line))
            except json.JSONDecodeError:
                s = None
            if s is None:
                skipped += 1
            else:
                specs.append(s)
        return specs, skipped


def per_request_window(specs: list[dict[str, Any]], skipped: int, k: int, floor: float | None) -> PerRequestWindow:
    """The window's requests: their count, those under ``floor``, the histogram of their ALs and of accepted tokens
    per draft (requests without a draft have no AL and are counted apart)."""
    edges = [1.0 + 0.5 * i for i in range(2 * k + 1)]  # 1, 1.5, ..., k + 1
    buckets = {f"{a:g}-{b:g}": 0 for a, b in zip(edges, edges[1:])}
    hist = [0] * (k + 1)
    below = no_drafts = 0
    for s in specs:
        h = [int(x) for x in s.get("acceptance_histogram") or []]
        for j, c in enumerate(h[: k + 1]):
            hist[j] += c
        if not sum(h):
            no_drafts += 1
            continue
        al = float(s.get("mean_acceptance_length", 1 + sum(j * c for j, c in enumerate(h)) / sum(h)))
        keys = list(buckets)
        buckets[keys[min(len(keys) - 1, max(0, int((al - 1.0) / 0.5)))]] += 1
        below += floor is not None and al < floor
    return PerRequestWindow(requests=len(specs), no_drafts=no_drafts, skipped_lines=skipped, floor=floor,
                            below_floor=below if floor is not None else None, al_histogram=buckets,
                            acceptance_histogram=hist)


def window_line(p: PerRequestWindow) -> str:
    """One line: how many requests, how many fell below the floor, the AL histogram."""
    fl = f", {p.below_floor} below the floor {p.floor:g}" if p.floor is not None else ""
    hist = " ".join(f"{b}:{n}" for b, n in p.al_histogram.items())
    return (f"per request: {p.requests} requests{fl}; AL histogram {hist}; accepted per draft {p.acceptance_histogram}"
            + (f"; {p.skipped_lines} lines without per-request metrics" if p.skipped_lines else ""))
