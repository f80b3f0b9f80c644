"""Before and after (validate --server URL --prompts FILE --triage --compare OLD/triage.json) against the recorded
fake vLLM server of test_triage.py: a first run where long prompts draft badly (AL ~2), a second after a
"recalibration" where the server's counters for long prompts reach AL ~4 and the short ones stay as they were."""

from __future__ import annotations

import json

import pytest

from eagle_migrate.errors import InputError
from eagle_migrate.validate import server_replay, triage, triage_compare
from eagle_migrate.engines.metrics import RequestCounts, paired_ratio
from eagle_migrate.validate.triage import TriagedRequest

from .test_triage import FakeServer, _run, _traffic


def _changed(path, tmp_path):
    """The same traffic with line 3 rewritten (another prompt on the same line) and an 11th line added."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[2] = {"prompt": "Tell me about the mountains and the snow instead"}
    rows.append({"prompt": "A brand new question about rivers"})
    out = tmp_path / "after.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _before(monkeypatch, tmp_path):
    path = _traffic(tmp_path / "t.jsonl")
    r, _ = _run(monkeypatch, FakeServer(), path, report_dir=tmp_path / "before")
    return path, r, tmp_path / "before" / "triage.json"


def test_the_recalibrated_group_is_improved_and_the_others_within_noise(monkeypatch, tmp_path):
    path, old, old_json = _before(monkeypatch, tmp_path)
    saved = json.loads(old_json.read_text())
    assert all(len(q["prompt_hash"]) == 16 and q["line"] and "num_drafts" in q and "num_accepted_tokens" in q
               and "acceptance_length" in q for q in saved["requests"])  # what pairing needs is in triage.json
    new, logs = _run(monkeypatch, FakeServer(long_accept=3), _changed(path, tmp_path), compare=old_json,
                     report_dir=tmp_path / "after")
    c = new.comparison
    assert c is not None and c.keyed_by == "line and prompt hash"
    assert (c.paired, c.only_before, c.only_after) == (9, 1, 2)  # line 3 changed: out on both sides; line 11 new
    assert c.only_before_lines == [3] and c.only_after_lines == [3, 11]
    assert any("9 requests paired, 1 only before, 2 only after" in m for m in logs)
    # the same groups as the old report, in its order
    assert [(g.feature, g.name) for g in c.groups] == [(g.feature, g.name) for g in old.groups]
    assert [g.below_before for g in c.groups] == [g.named for g in old.groups]
    old_by, new_by = {q.line: q for q in old.requests}, {q.line: q for q in new.requests}
    for g in c.groups:
        lines = sorted(q.line for q in old.requests if q.feature(g.feature) == g.name and q.line != 3)
        assert g.requests == len(lines)
        pr = paired_ratio([RequestCounts(old_by[ln].num_drafts, old_by[ln].num_accepted_tokens) for ln in lines],
                          [RequestCounts(new_by[ln].num_drafts, new_by[ln].num_accepted_tokens) for ln in lines])
        assert g.paired.ratio == pytest.approx(pr["ratio"], abs=1e-4) and g.paired.se == pytest.approx(pr["se"], abs=1e-4)
        long_ = all(ln >= 7 for ln in lines)
        if long_:  # the long prompts (chat template, the system prompt, their kind): AL ~2 -> ~4
            assert g.al_before < 2.1 and g.al_after > 3.6 and g.paired.ratio > 1.7
            assert g.paired.verdict == "improved" and g.text in c.improved
        else:  # the short ones: the same counters before and after
            assert g.paired.ratio == pytest.approx(1.0) and g.paired.verdict == "within noise"
    assert any(g.below_before and g.paired.verdict == "improved" for g in c.groups)
    assert {g.paired.verdict for g in c.groups} == {"improved", "within noise"} and not c.worse
    assert c.pooled.requests == 9 and c.pooled.paired.verdict == "improved" and c.pooled.paired.ratio > 1.2
    doc = json.loads((tmp_path / "after" / "triage.json").read_text())
    assert doc["comparison"]["paired"] == 9 and doc["comparison"]["pooled"]["paired"]["verdict"] == "improved"


def test_a_compare_against_other_prompts_is_refused_before_any_request(monkeypatch, tmp_path):
    _, _, old_json = _before(monkeypatch, tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"something else entirely {i}"}) + "\n" for i in range(5)))
    fake = FakeServer()
    with pytest.raises(InputError, match=r"none of its 10 requests has a match in .*other prompts"):
        _run(monkeypatch, fake, other, compare=old_json)
    assert fake.sent == []
    with pytest.raises(InputError, match="no such file"):
        _run(monkeypatch, FakeServer(), other, compare=tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"pooled": {}}')
    with pytest.raises(InputError, match="not a triage report"):
        _run(monkeypatch, FakeServer(), other, compare=tmp_path / "bad.json")
    with pytest.raises(InputError, match="overlaps the input"):  # --report never writes over the old report
        _run(monkeypatch, FakeServer(), other, compare=old_json, report_dir=old_json.parent)


def test_an_old_report_without_prompt_hashes_pairs_by_line(monkeypatch, tmp_path):
    path, _, old_json = _before(monkeypatch, tmp_path)
    doc = json.loads(old_json.read_text())
    for q in doc["requests"]:
        del q["prompt_hash"]
    old_json.write_text(json.dumps(doc))
    new, _ = _run(monkeypatch, FakeServer(long_accept=3), path, compare=tmp_path / "before")  # the folder does too
    c = new.comparison
    assert c.keyed_by.startswith("line alone") and (c.paired, c.only_before, c.only_after) == (10, 0, 0)


def test_a_worse_group_and_repeated_prompts_pair_in_order():
    def req(i, line, acc, h="h"):
        return TriagedRequest(index=i, line=line, prompt_hash=h, template="t", num_drafts=10,
                              num_accepted_tokens=acc + i % 2, acceptance_length=1 + (acc + i % 2) / 10)

    before = [req(i, 0, 20) for i in range(6)] + [req(6, 0, 20, "x")]
    after = [req(i, 0, 10) for i in range(5)]  # a JSON list file (line 0): the five first of six "h" pair
    pairs, only_b, only_a = triage_compare.pair(before, after)
    assert [(b.index, a.index) for b, a in pairs] == [(i, i) for i in range(5)]
    assert [r.index for r in only_b] == [5, 6] and only_a == []
    g = triage_compare.change("template", "t", pairs)
    assert g.paired.verdict == "worse" and g.paired.ratio < 1 and g.al_after < g.al_before


def test_a_request_without_drafts_counts_in_no_group_before_or_after():
    """As in the triage's groups: a request that made no draft (it ended after one token) is paired but counts in
    no group's n, before or after."""
    def req(i, drafts):
        return TriagedRequest(index=i, line=i + 1, prompt_hash=f"h{i}", template="t", num_drafts=drafts,
                              num_accepted_tokens=2 * drafts, acceptance_length=3.0 if drafts else None)

    reqs = [req(i, 10) for i in range(4)] + [req(4, 0)]
    pooled, groups = triage.group_requests(reqs + [TriagedRequest(index=5, line=6, prompt_hash="h5", template="u",
                                                                  num_drafts=10, num_accepted_tokens=20,
                                                                  acceptance_length=3.0)])
    before = triage_compare.BeforeReport(requests=reqs, groups=groups, prompts_file="p", server={})
    out = triage_compare.compare(before, reqs, "before/triage.json")
    assert out.paired == 5 and out.pooled.requests == 4
    assert next(g for g in out.groups if g.name == "t").requests == 4 == pooled.with_drafts - 1


def test_cli_compare_table_json_and_refusal(monkeypatch, tmp_path, capsys):
    from eagle_migrate.cli import main

    path, _, old_json = _before(monkeypatch, tmp_path)
    monkeypatch.setattr(server_replay, "ServerClient", lambda url, key=None, **k: FakeServer(long_accept=3))
    args = ["validate", "--server", "http://fake:8000/v1", "--prompts", str(path), "--triage", "--max-tokens", "24",
            "--compare", str(old_json)]
    with pytest.raises(SystemExit) as e:
        main(args + ["--json"])
    out, _ = capsys.readouterr()
    doc = json.loads(out)  # one document: the triage with its comparison
    assert e.value.code in (0, None) and doc["comparison"]["paired"] == 10 and doc["comparison"]["improved"]
    assert doc["requests"] and {g["paired"]["verdict"] for g in doc["comparison"]["groups"]} == {"improved",
                                                                                                  "within noise"}
    with pytest.raises(SystemExit) as e:
        main(args)
    out, _ = capsys.readouterr()
    assert e.value.code in (0, None) and "before / after" in out and "after/before" in out and "improved:" in out
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "unrelated"}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["validate", "--server", "http://fake:8000/v1", "--prompts", str(other), "--compare", str(old_json)])
    assert e.value.code == 2 and "other prompts" in capsys.readouterr().err
