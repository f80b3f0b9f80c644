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
        text = p.read_text(encoding="utf-8")
        codes.update(re.findall(r"\bfinding\(\s*(?:\"[a-z]+\"|sev),\s*\"([a-z0-9_]+)\"", text))
        codes.update(re.findall(r"\bMismatch\(\s*\"([a-z0-9_]+)\"", text))  # pairing.size_mismatches: findings via m.code
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


@pytest.mark.parametrize("layout", ["vllm", "speculators", "safeailab-eagle3", "specforge", "modelopt", "torchspec"])
def test_each_trap_is_reported_once_with_a_target(tmp_path, toy_target, layout):
    """Reader and pairing each own their traps: with a target nothing is reported twice (inspect no longer drops
    repeated findings afterwards). SafeAILab's all-zero d2t with Vd = V is d2t_with_full_vocab exactly once."""
    from eagle_migrate import toy
    from eagle_migrate.inspection import inspect_checkpoint

    from ..layouts import write_layout

    p = write_layout(layout, toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp_path / layout)
    r = inspect_checkpoint(p, target=str(toy_target), aux_ids_convention="vllm")
    keys = [(f.code, f.message) for f in r.findings]
    assert len(keys) == len(set(keys)), keys
    codes = [f.code for f in r.findings]
    assert codes.count("aux_ids_unsorted") <= 1 and codes.count("aux_id_last_layer") <= 1
    if layout == "safeailab-eagle3":
        assert codes.count("d2t_with_full_vocab") == 1


@pytest.mark.parametrize("ids,t", [([1, 1, 5], 6), ([5, 3], 6), ([-1, 3, 5], 6), ([1, 3, 9], 6), ([1, 3, 6], 6),
                                   (None, 6), (None, 3), ([5, 3, 1], 6)])
def test_aux_id_checks_split_into_the_checkpoint_alone_and_the_target(ids, t):
    """check_aux_ids = what the ids say alone (the readers) + what the target adds (inspect's pairing), no overlap."""
    from eagle_migrate.formats import aux_ids as A

    alone, on_target = A.check_aux_ids_alone(ids, 3), A.check_aux_ids_on_target(ids, 3, t)
    assert [f.code for f in A.check_aux_ids(ids, 3, t)] == [f.code for f in alone + on_target]
    assert not {(f.code, f.message) for f in alone} & {(f.code, f.message) for f in on_target}
    assert A.check_aux_ids(ids, 3) == alone
