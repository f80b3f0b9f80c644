"""One table of traps (formats/traps.py TRAPS): every code emitted is in it, every row is emitted somewhere, and
docs/formats.md shows exactly the same codes, severities and meanings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle_migrate.formats.traps import TRAPS, finding

ROOT = Path(__file__).resolve().parents[2]


def _doc_rows() -> dict[str, tuple[tuple[str, ...], str]]:
    """code -> (severities, meaning) from the `| `code` | severity | meaning |` rows of docs/formats.md."""
    out: dict[str, tuple[tuple[str, ...], str]] = {}
    for line in (ROOT / "docs" / "formats.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| (`[a-z0-9_]+`(?:, `[a-z0-9_]+`)*) \| ([a-z /]+) \| (.*) \|$", line)
        if not m:
            continue
        codes = re.findall(r"`([a-z0-9_]+)`", m.group(1))
        sevs = tuple(s.strip() for s in m.group(2).split("/"))
        for i, c in enumerate(codes):
            assert c not in out, f"{c} is in two rows of docs/formats.md"
            out[c] = ((sevs[i],) if len(codes) > 1 and len(sevs) == len(codes) else sevs, m.group(3))
    return out


def _emitted_codes() -> set[str]:
    codes = set()
    for p in (ROOT / "eagle_migrate").rglob("*.py"):
        codes.update(re.findall(r"\bfinding\(\s*(?:\"[a-z]+\"|sev),\s*\"([a-z0-9_]+)\"", p.read_text(encoding="utf-8")))
    return codes


def test_docs_show_the_table():
    docs = _doc_rows()
    assert set(docs) == set(TRAPS)
    for code, t in TRAPS.items():
        assert docs[code] == (t.severities, t.meaning), code


def test_every_emitted_code_is_a_row_and_every_row_is_emitted():
    emitted = _emitted_codes()
    assert len(emitted) > 60
    assert emitted == set(TRAPS)


def test_finding_refuses_codes_and_severities_outside_the_table():
    assert finding("error", "d2t_missing", "m").severity == "error"
    assert finding("error", "no_lm_head", "m").code == "no_lm_head" and finding("warning", "no_lm_head", "m")
    with pytest.raises(ValueError, match="not in"):
        finding("error", "d2t_mising", "m")
    with pytest.raises(ValueError, match="not info"):
        finding("info", "d2t_missing", "m")
