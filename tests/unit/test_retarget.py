"""Retargeting (issue 50): a drafter trained for target A, served with a changed target B.

* detection (target_fit.py): the config's evidence and step 0 on B's own text, against A's (``--trained-for``) or a
  threshold; with A, which of the two targets' tokens the drafter proposes where they differ; it fires on the toy's
  changed targets and not when B is A;
* the default: convert fine-tunes a drafter that does not fit its target on a CPU too (within a wall-clock budget),
  and judges only when it fits, as before;
* traffic data (``--data FILE``): malformed lines are named by their line, the held-out split is by content and a
  judged prompt is never trained on, and the held-out part is the judge's own suite;
* the target's own answers (``--data answered[:SPEC]``, the retarget default's data): a source's first requests,
  answered by the target, trained on in place of the source's own replies.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.calibration_data import TRAFFIC_SUITE, traffic_prompts
from eagle_migrate.corpora import content_key, split_traffic
from eagle_migrate.corpora.sources import Conversation
from eagle_migrate.errors import DataError
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.target import LazyTarget
from eagle_migrate import target_fit
from eagle_migrate.target_fit import (FOLLOW_FIRST_LOOK, FOLLOW_SEQUENCES, THRESHOLD, Agreement, Follows, TargetFit,
                                     assess, trained_for)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("retarget")
    return {"A": toy.write_target(d / "A"), "B": toy.write_changed_target(d / "B", every=8, changed=5),
            "B-mild": toy.write_changed_target(d / "B-mild", every=7, changed=1), "oracle": toy.write_drafter(d / "oracle"),
            "random": toy.write_drafter(d / "random", "random"), "root": d}


def _fit(pair, drafter: str, target: str, ref: str | None = None):
    ck = read_checkpoint(pair[drafter])
    lt = LazyTarget(str(pair[target]), "cpu", torch.float32)
    return assess(ck, lt, ck.config.aux_layer_ids, trained_for_path=str(pair[ref]) if ref else None)


def test_the_changed_targets_write_other_text(pair):
    """B's greedy next token differs from A's at 5 tokens of 8; its hidden states are A's."""
    a, b = toy.target_state_dict(), toy.changed_target_state_dict(8, 5)
    assert all(torch.equal(a[k], b[k]) for k in a if k != "lm_head.weight")
    assert not torch.equal(a["lm_head.weight"], b["lm_head.weight"])


def test_detection_fires_on_a_changed_target(pair):
    f = _fit(pair, "oracle", "B")  # no reference: B's agreement (1/5) against the threshold
    assert f.verdict == "stale" and f.stale
    assert 0.15 < f.on_target.agreement < THRESHOLD and f.on_trained_for is None
    assert "recalibration recommended" in f.message and "--trained-for" in f.message
    g = _fit(pair, "oracle", "B", ref="A")  # with A: 1/5 against 1.0 on A's own text
    assert g.verdict == "stale" and g.on_trained_for.agreement == pytest.approx(1.0)
    assert f"against {g.on_trained_for.agreement:.2f} on its own target's" in g.message


def test_a_mild_change_needs_the_reference(pair):
    """B-mild keeps 2/3 of the drafts: above the threshold (fits without A), below A's 1.0 beyond noise (stale with
    A): the message says which was measured."""
    f = _fit(pair, "oracle", "B-mild")
    assert f.verdict == "fits" and f.on_target.agreement > THRESHOLD
    assert _fit(pair, "oracle", "B-mild", ref="A").verdict == "stale"


def test_detection_does_not_fire_when_b_is_a(pair):
    for ref in (None, "A"):
        f = _fit(pair, "oracle", "A", ref)
        assert f.verdict == "fits" and not f.stale and f.on_target.agreement == pytest.approx(1.0)


def test_a_drafter_that_drafts_nothing_gives_no_verdict(pair):
    """A random drafter agrees about 1/64 on A: no evidence either way (a recalibration does not make it a
    drafter), so the default does not change."""
    f = _fit(pair, "random", "A")
    assert f.verdict == "no-evidence" and not f.stale and "drafts almost nothing" in f.message


def test_config_evidence(pair, tmp_path):
    """The target a producer recorded: speculators' verifier, a config key, this project's provenance.json. A name
    equal to the served target's proves nothing (a fine-tune keeps it): the measurement decides."""
    d = toy.write_drafter(tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    cfg["base_model_name_or_path"] = "org/Some-Other-Model"
    (d / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(d)
    assert trained_for(ck) == ("org/Some-Other-Model", "base_model_name_or_path")
    f = assess(ck, LazyTarget(str(pair["A"]), "cpu", torch.float32), ck.config.aux_layer_ids)
    # the config names another model, but the drafter drafts A's own text as well as ever: said, not acted on (a
    # model under another name or in another folder must not be fine-tuned by default)
    assert f.config == "other" and f.verdict == "fits"
    assert f.message.startswith("trained for org/Some-Other-Model (its base_model_name_or_path), served with A")
    # the target the config names is here (a folder): measured as the reference, as --trained-for would be
    cfg["base_model_name_or_path"] = str(pair["A"])
    (d / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(d)
    f = assess(ck, LazyTarget(str(pair["B"]), "cpu", torch.float32), ck.config.aux_layer_ids)
    assert f.on_trained_for is not None and f.verdict == "stale" and "named by its config, found here" in f.message
    import shutil

    same = shutil.copytree(pair["A"], tmp_path / "A-copy")  # A itself in another folder: the reference agrees
    f = assess(ck, LazyTarget(str(same), "cpu", torch.float32), ck.config.aux_layer_ids)
    assert f.config == "other" and f.on_trained_for is not None and f.verdict == "fits"
    cfg["base_model_name_or_path"] = "A"
    (d / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(d)
    f = assess(ck, LazyTarget(str(pair["A"]), "cpu", torch.float32), ck.config.aux_layer_ids)
    assert f.config == "same" and f.verdict == "fits"
    (d / "provenance.json").write_text(json.dumps({"target_name": "A"}))
    del cfg["base_model_name_or_path"]
    (d / "config.json").write_text(json.dumps(cfg))
    assert trained_for(read_checkpoint(d)) == ("A", "provenance.json target_name")
    nothing = assess(read_checkpoint(d), None, None)
    assert nothing.verdict == "not measured" and not nothing.stale


def test_inspect_reports_the_fit_only_with_a_target(pair):
    from eagle_migrate.inspection import inspect_checkpoint

    assert inspect_checkpoint(pair["oracle"]).target_fit is None
    r = inspect_checkpoint(pair["oracle"], target=str(pair["B"]), device="cpu", trained_for=str(pair["A"]))
    assert r.target_fit.verdict == "stale" and r.target_fit.on_trained_for is not None
    assert inspect_checkpoint(pair["oracle"], target=str(pair["A"]), device="cpu").target_fit.verdict == "fits"


def test_inspect_cli_takes_trained_for(pair):
    from typer.testing import CliRunner

    from eagle_migrate.cli import app

    r = CliRunner().invoke(app, ["inspect", str(pair["oracle"]), "--target", str(pair["B"]), "--trained-for",
                                 str(pair["A"]), "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["target_fit"]["verdict"] == "stale"


# ----- the default decision ------------------------------------------------------------------------------------------
@pytest.fixture
def recorded(calibration_recorder):
    """The calibration replaced by a recorder: what convert asks it to do is under test, not the fine-tune."""
    return calibration_recorder


def test_convert_fine_tunes_a_drafter_that_does_not_fit_on_a_cpu(pair, recorded, tmp_path):
    from eagle_migrate.convert import convert
    from eagle_migrate.convert.defaults import RETARGET_CPU_ENDS_BY, RETARGET_CPU_MINUTES

    t0 = time.time()
    res = convert(pair["oracle"], str(pair["B"]), tmp_path / "b", device="cpu", command="test")
    assert res.target_fit.stale
    assert res.decision == ("fine-tuned (trained for another target; recipe --train all --num-sequences 256 --steps 400 "
                            "--max-minutes 8)")  # docs/calibration.md
    s = recorded[-1]
    assert s.steps == 400 and s.train == "all" and s.max_minutes == RETARGET_CPU_MINUTES and s.num_sequences == 256
    # on a CPU the fine-tune also ends by RETARGET_CPU_ENDS_BY minutes after convert started (the 15-minute convert)
    assert t0 <= s.ends_by - RETARGET_CPU_ENDS_BY * 60.0 <= time.time()
    assert f"ending by {RETARGET_CPU_ENDS_BY:g} minutes into convert" in res.defaults
    from eagle_migrate.cli.options import MaxMinutesOpt  # --help says the same deadline

    assert f"ends {RETARGET_CPU_ENDS_BY:g} minutes into convert" in MaxMinutesOpt.__metadata__[0].help
    assert any(w.startswith("warning: target fit:") for w in res.warnings)
    prov = json.loads((tmp_path / "b" / "provenance.json").read_text())
    assert prov["target_fit"]["verdict"] == "stale"
    # --max-minutes given: the budget is the user's
    # --max-minutes and -n given: the budget and the data's size are the user's
    convert(pair["oracle"], str(pair["B"]), tmp_path / "b2", num_sequences=8, device="cpu", command="test",
            max_minutes=2.0)
    assert recorded[-1].max_minutes == 2.0 and recorded[-1].num_sequences == 8 and recorded[-1].ends_by is None


def test_the_cli_leaves_n_to_the_retarget_recipe_unless_given(pair, recorded, tmp_path):
    """`convert` without -n: the recipe's 256 sequences for a drafter that does not fit (the CLI once passed its
    default 32 as if chosen, so the CLI's recalibration trained on 32); with -n, the user's number."""
    from typer.testing import CliRunner

    from eagle_migrate.cli import app

    base = ["convert", str(pair["oracle"]), "--target", str(pair["B"]), "--device", "cpu", "--json"]
    r = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert recorded[-1].num_sequences == 256 and "--num-sequences 256" in json.loads(r.stdout)["decision"]
    r = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b"), "-n", "12"])
    assert r.exit_code == 0, r.output
    assert recorded[-1].num_sequences == 12 and "--num-sequences" not in json.loads(r.stdout)["decision"]


def test_migrate_leaves_n_to_the_retarget_recipe_unless_given():
    """migrate hands convert only what was given: -n unset reaches convert unset (the retarget recipe's 256 applies)."""
    from eagle_migrate.convert.defaults import SourceKind, recipe
    from eagle_migrate.migrate import MigrateOptions, convert_options

    kind = SourceKind(kind="speculators-style", meaning="")
    for given, want in ((None, 256), (12, None)):
        o = convert_options(MigrateOptions.of() if given is None else MigrateOptions.of(num_sequences=given))
        taken = recipe(kind, o.calibration, False, True, retarget=True, cpu=True,
                       n_given="num_sequences" in o.model_fields_set)
        assert taken.get("num_sequences") == want and taken["train"] == "all"


def test_a_larger_n_feeds_the_fine_tune_not_the_cpu_statistics_pass(pair, recorded, tmp_path):
    """On a CPU the statistics pass reads at most STATS_MAX_SEQUENCES_CPU sequences whatever -n is (a retarget's 256
    passed through it one at a time for 10 minutes); the fine-tune still gets all of them."""
    from eagle_migrate.convert import STATS_MAX_SEQUENCES, STATS_MAX_SEQUENCES_CPU, convert
    from eagle_migrate.convert.records import stats_sequences

    totals: list[int | None] = []
    convert(pair["oracle"], str(pair["A"]), tmp_path / "a", num_sequences=STATS_MAX_SEQUENCES_CPU + 8, device="cpu",
            command="test", progress=lambda stage, done, total, info="": totals.append(total) if stage == "statistics" else None)
    assert totals and set(totals) == {STATS_MAX_SEQUENCES_CPU}
    assert recorded[-1].num_sequences == STATS_MAX_SEQUENCES_CPU + 8
    assert stats_sequences(1000, "cuda:0") == STATS_MAX_SEQUENCES and stats_sequences(8, "cpu") == 8


def test_convert_judges_only_when_the_drafter_fits(pair, recorded, tmp_path):
    from eagle_migrate.convert import convert

    res = convert(pair["oracle"], str(pair["A"]), tmp_path / "a", num_sequences=8, device="cpu", command="test")
    assert res.target_fit.verdict == "fits"
    assert res.decision == "judged only (CPU default)" and recorded[-1].steps == 0
    assert not any("target fit" in w for w in res.warnings)


# ----- traffic data ---------------------------------------------------------------------------------------------------
def _traffic(path: Path, n: int = 40) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            if i % 3:
                f.write(json.dumps({"prompt": f"request {i}: count from {i} to {i + 9}"}) + "\n")
            else:
                f.write(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": f"chat {i}: hello"}]}) + "\n")
    return path


def test_malformed_traffic_lines_name_their_line(pair, tmp_path):
    """A line that is not JSON, or a record of no known shape, is a DataError naming the file and its line (through
    the reader, corpora/sources.py), before anything is computed."""
    lt = LazyTarget(str(pair["A"]), "cpu", torch.float32)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{"prompt": "broken\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: line 3"):
        traffic_prompts(lt, bad, 8, 0, 64, 4)
    shape = tmp_path / "shape.jsonl"
    shape.write_text('{"prompt": "fine"}\n{"question_text": "no known key"}\n')
    with pytest.raises(DataError, match=r"shape\.jsonl: line 2"):
        traffic_prompts(lt, shape, 8, 0, 64, 4)


def test_the_held_out_split_is_by_content():
    convs = [Conversation([{"role": "user", "content": f"prompt {i}"}]) for i in range(200)]
    train, held = split_traffic(convs)
    assert 0.08 < len(held) / len(convs) < 0.25  # about TRAFFIC_HELDOUT
    keys = {content_key(c) for c in held}
    assert not keys & {content_key(c) for c in train}
    # the same prompts in another order, with copies: the same split, every copy on the same side
    again = list(reversed(convs)) + convs[:50]
    t2, h2 = split_traffic(again)
    assert {content_key(c) for c in h2} == keys and not {content_key(c) for c in t2} & keys
    # a small file still gets a few held-out prompts, and keeps as many to train on
    few_train, few_held = split_traffic(convs[:6])
    assert len(few_held) == 3 and len(few_train) == 3


def test_a_judged_prompt_is_never_trained_on(pair, tmp_path, monkeypatch):
    """Through calibrate_checkpoint: the held-out prompts are the suite ``traffic`` beside the others, and no
    training sequence starts with one of them (the training sequences are the target's answers to the others)."""
    import eagle_migrate.calibrate.checkpoint as ckm
    from eagle_migrate.calibrate import CalibrationSettings

    data = _traffic(tmp_path / "traffic.jsonl")
    seen = {}

    def fake_calibrate(model, tgt, train_seqs, held, settings, **kw):
        seen.update(train=train_seqs, held=held)
        raise RuntimeError("stop")

    monkeypatch.setattr(ckm, "calibrate", fake_calibrate)
    with pytest.raises(RuntimeError, match="stop"):
        ckm.calibrate_checkpoint(pair["oracle"], str(pair["A"]), CalibrationSettings(
            device="cpu", data=str(data), num_sequences=64, steps=1, suites=("chat",), heldout_per_suite=40))
    judged = seen["held"][TRAFFIC_SUITE]
    assert judged and "chat" in seen["held"]
    assert all(not any(t[: len(p)] == p for p in judged) for t in seen["train"])
    lt = LazyTarget(str(pair["A"]), "cpu", torch.float32)
    train_prompts, held_prompts = traffic_prompts(lt, data, 64, 0, 256, 40)
    assert held_prompts == judged and len(train_prompts) + len(held_prompts) == 40
    # each training sequence is a training prompt followed by the target's own answer (x + 1 in the toy world)
    for t, p in zip(seen["train"], train_prompts):
        assert t[: len(p)] == p and len(t) > len(p)
        assert all(b == (a + 1) % toy.H for a, b in zip(t[len(p):], t[len(p) + 1:]))


def test_traffic_answers_come_in_the_held_out_continuations_engine_call(pair, tmp_path, monkeypatch):
    """The training prompts of ``--data FILE`` are answered by the target in the same engine call as the held-out
    continuations (vLLM: one engine start; the answers at most TRAFFIC_ANSWER_TOKENS within the sequence length, the
    held-out sets at their own length); an engine that makes none leaves them to transformers; a run that only
    judges asks for no answer at all."""
    import eagle_migrate.calibrate.checkpoint as ckm
    from eagle_migrate.calibrate import CalibrationSettings
    from eagle_migrate.calibration_data import TRAIN_ANSWERS, answer_tokens
    from eagle_migrate.engines import vllm_engine

    calls = []

    def fake_measure(target, drafter, suites, **kw):
        calls.append({n: (len(j["prompts"]), j["max_tokens"]) for n, j in suites.items()})
        return {n: (None, {"outputs": [[7] * j["max_tokens"] for _ in j["prompts"]]}) for n, j in suites.items()}

    monkeypatch.setattr(vllm_engine, "measure", fake_measure)
    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: True)
    held = {"chat": [[1, 2, 3]], TRAFFIC_SUITE: [[4, 5], [6]]}
    asked = [[9] * 10, [8] * 30]
    s = CalibrationSettings(device="cpu", engine="vllm")
    got, train = ckm._heldout_continuations(str(pair["A"]), held, 16, s, asked, 100)
    assert answer_tokens(asked, 100) == 70 and answer_tokens([[1] * 10], 1000) == 128
    assert calls == [{"chat": (1, 16), TRAFFIC_SUITE: (2, 16), TRAIN_ANSWERS: (2, 70)}]
    assert set(got) == {"chat", TRAFFIC_SUITE} and got["chat"][0].ids == [1, 2, 3] + [7] * 16
    assert train == [[9] * 10 + [7] * 70, [8] * 30 + [7] * 70]
    # without training prompts: the held-out sets alone
    got, train = ckm._heldout_continuations(str(pair["A"]), held, 16, s)
    assert train is None and calls[-1] == {"chat": (1, 16), TRAFFIC_SUITE: (2, 16)}
    # the reference engine makes none: the prompts as they are, the answers left to transformers
    got, train = ckm._heldout_continuations(str(pair["A"]), held, 16, s.replace(engine="reference"), asked, 100)
    assert got is held and train is None and len(calls) == 2
    # the judge alone (steps 0) reads no training sequence, so none is asked for
    lt = LazyTarget(str(pair["A"]), "cpu", torch.float32)
    data = _traffic(tmp_path / "traffic.jsonl")
    asked_j, suites = ckm._traffic(lt, data, {}, 256, CalibrationSettings(device="cpu", steps=0), 40)
    asked_t, suites_t = ckm._traffic(lt, data, {}, 256, CalibrationSettings(device="cpu", steps=5), 40)
    assert asked_j is None and asked_t and suites[TRAFFIC_SUITE] == suites_t[TRAFFIC_SUITE]


def _chats(path: Path, n: int = 12) -> Path:
    """Whole conversations (ShareGPT turns): a system turn on some, two user turns and two replies each; and a record
    with no user turn at all (which the reader leaves out)."""
    with open(path, "w") as f:
        for i in range(n):
            turns = [{"from": "system", "value": "be brief"}] if i % 2 else []
            turns += [{"from": "human", "value": f"question {i}: count to {i + 3}"},
                      {"from": "gpt", "value": f"THE SOURCE'S REPLY {i}: " + "z" * 40},
                      {"from": "human", "value": f"and a follow-up {i}"},
                      {"from": "gpt", "value": f"ANOTHER REPLY {i}"}]
            f.write(json.dumps({"conversations": turns}) + "\n")
        f.write(json.dumps({"conversations": [{"from": "gpt", "value": "a reply to nobody"}]}) + "\n")
    return path


def test_answered_reads_a_source_s_first_requests(tmp_path):
    """``answered:SPEC``: each conversation's first request (its system turns and first user turn), never a reply nor
    a later turn; a conversation without a user turn is left out; token-id records have no request to answer."""
    from eagle_migrate.corpora.sources import load_conversations

    whole = load_conversations(str(_chats(tmp_path / "c.jsonl")))
    first = load_conversations(f"answered:{tmp_path / 'c.jsonl'}")
    assert len(whole) == len(first) == 12  # the reader leaves out the record without a user turn
    assert Conversation([{"role": "assistant", "content": "hi"}]).first_request() is None
    assert [m["role"] for m in first[0].messages] == ["user"]
    assert [m["role"] for m in first[1].messages] == ["system", "user"]
    assert first[3].messages[-1]["content"] == "question 3: count to 6" and not first[3].ends_with_reply
    assert len(load_conversations(f"answered:{tmp_path / 'c.jsonl'}", limit=5, seed=1)) <= 5
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"token_ids": [1, 2, 3]}\n')
    with pytest.raises(DataError, match="not token_ids"):
        load_conversations(f"answered:{ids}")


def test_a_long_request_is_cut_so_that_the_target_still_answers_it():
    """A request longer than the room for it keeps its template's end and generation prompt: its last user turn's
    text is cut (the longest cut that fits), never the rendered prompt's tail (the target would continue the user's
    words instead of answering); token ids are cut as they are."""
    import eagle_migrate.corpora as dm

    tok = dm.ByteTokenizer(toy.H)
    text = "word " * 200

    def ask(t: str) -> list[int]:
        return dm.render(Conversation([{"role": "system", "content": "be brief"}, {"role": "user", "content": t}]), tok)

    out = dm.render_within(Conversation([{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": text}]), tok, 120)
    assert len(out) <= 120 and out != ask(text)[:120]
    k = next(k for k in range(len(text), 0, -1) if ask(text[:k]) == out)
    assert len(ask(text[: k + 1])) > 120  # the longest cut that fits
    assert dm.render_within(Conversation([{"role": "user", "content": "short"}]), tok, 120) == \
        dm.render(Conversation([{"role": "user", "content": "short"}]), tok)
    assert dm.render_within(Conversation(token_ids=list(range(50))), tok, 20) == list(range(20))


def test_the_retarget_default_trains_on_the_target_s_own_answers(pair, tmp_path, monkeypatch):
    """The retarget recipe's data is ``answered`` (ShareGPT's first requests answered by the target where ShareGPT
    is here, else the built-in set's, loudly) unless --data is given; through calibrate_checkpoint each training
    sequence is a first request followed by the target's own greedy answer (x + 1 in the toy world), never the
    source's reply, and the judge's suites are the usual ones (nothing of the data is held out); a run that only
    judges answers nothing."""
    import eagle_migrate.calibrate.checkpoint as ckm
    import eagle_migrate.corpora as dm
    from eagle_migrate.calibrate import CalibrationSettings
    from eagle_migrate.calibration_data import BUILTIN_DATA_WARNING, resolve_data
    from eagle_migrate.convert.defaults import SourceKind, recipe
    from eagle_migrate.migrate import MigrateOptions, convert_options

    kind = SourceKind(kind="speculators-style", meaning="")
    cal = convert_options(MigrateOptions.of()).calibration
    assert recipe(kind, cal, False, True, retarget=True, cpu=True)["data"] == "answered"
    assert "data" not in recipe(kind, cal, True, False, retarget=True, cpu=True)  # --data given
    assert "data" not in recipe(kind, cal, False, False, retarget=True, cpu=True)  # a tokenizer-less target
    monkeypatch.setattr(dm.sources, "sharegpt_file", lambda fetch=False: tmp_path / "sharegpt.json")
    assert resolve_data("answered", object()) == ("answered:sharegpt", None)
    assert resolve_data("answered:hf:org/set", object()) == ("answered:hf:org/set", None)
    monkeypatch.setattr(dm.sources, "sharegpt_file", lambda fetch=False: None)
    assert resolve_data("answered", object()) == ("answered:builtin", BUILTIN_DATA_WARNING)

    data = f"answered:{_chats(tmp_path / 'chats.jsonl')}"
    seen = {}

    def fake_calibrate(model, tgt, train_seqs, held, settings, **kw):
        seen.update(train=train_seqs, held=held, data=kw.get("data_name"))
        raise RuntimeError("stop")

    monkeypatch.setattr(ckm, "calibrate", fake_calibrate)
    with pytest.raises(RuntimeError, match="stop"):
        ckm.calibrate_checkpoint(pair["oracle"], str(pair["A"]), CalibrationSettings(
            device="cpu", data=data, num_sequences=64, steps=1, suites=("chat",), heldout_per_suite=4))
    assert set(seen["held"]) == {"chat"} and seen["data"] == data
    tok = dm.ByteTokenizer(toy.H)
    firsts = dm.sources.load_conversations(data)
    prompts = [dm.render(c, tok)[:128] for c in firsts]
    assert len(seen["train"]) == len(prompts) == 12
    for t, p, c in zip(seen["train"], prompts, firsts):
        assert t[: len(p)] == p and len(t) > len(p)
        assert all(b == (a + 1) % toy.H for a, b in zip(t[len(p):], t[len(p) + 1:]))  # the target's own answer
        whole = dm.render(dm.sources.load_conversations(str(tmp_path / "chats.jsonl"))[firsts.index(c)], tok,
                          whole=True)
        assert t != whole[: len(t)]  # not the source's conversation with its replies
    with pytest.raises(RuntimeError, match="stop"):
        ckm.calibrate_checkpoint(pair["oracle"], str(pair["A"]), CalibrationSettings(
            device="cpu", data=data, num_sequences=64, steps=0, suites=("chat",), heldout_per_suite=4))
    assert seen["train"] is None


def test_the_fine_tune_progress_carries_an_eta():
    """The fine-tune's progress line: the mean time per step so far times the steps left of those the trainer says
    it will reach (under a budget, those that fit in it); the bar's total is that reach."""
    from eagle_migrate.calibrate.progress import eta, progress_adapter

    assert eta(0.0, 1, 1, 20, 5.0) == ""  # the first step's record starts the clock
    assert eta(0.0, 1, 3, 20, 20.0) == "ETA 2m50s"  # 10 s a step, 17 left
    lines, totals = [], []
    adapt = progress_adapter(lambda stage, done, total, info="": (lines.append(info), totals.append(total)))
    for step in (1, 2, 3):
        adapt({"phase": "train", "step": step, "steps": 400, "reach": 9 + step, "loss": 1.0, "step_acc": [0.5]})
    assert "ETA" not in lines[0] and lines[-1].endswith("s") and "ETA" in lines[-1]
    assert totals == [10, 11, 12]  # the trainer's reach, not the planned 400
    adapt({"phase": "train", "step": 4, "steps": 400, "loss": 1.0, "step_acc": [0.5]})  # a record without it
    assert totals[-1] == 400


def test_a_deadline_caps_the_fine_tune_s_budget():
    """``ends_by``: the budget is what is left until then when that is less than ``max_minutes`` (at least
    MIN_BUDGET_S); without it, ``max_minutes``; with neither, none."""
    from eagle_migrate.calibrate.settings import MIN_BUDGET_S, CalibrationSettings

    assert CalibrationSettings(max_minutes=8.0, ends_by=1000.0).budget_s(800.0) == 200.0
    assert CalibrationSettings(max_minutes=2.0, ends_by=1000.0).budget_s(800.0) == 120.0
    assert CalibrationSettings(max_minutes=8.0, ends_by=1000.0).budget_s(990.0) == MIN_BUDGET_S
    assert CalibrationSettings(ends_by=1000.0).budget_s(700.0) == 300.0
    assert CalibrationSettings(max_minutes=8.0).budget_s(990.0) == 480.0 and CalibrationSettings().budget_s(0.0) is None


def test_convert_judges_on_the_triage_held_out_file(pair, tmp_path):
    """``validate --triage --worst FILE`` writes FILE and FILE.heldout.jsonl by convert's own rule; ``convert --data
    FILE`` then judges on exactly the held-out file's prompts and trains on FILE's (a prompt in both is held out,
    never trained on); without the file beside it, FILE is split by content as any traffic file."""
    lt = LazyTarget(str(pair["A"]), "cpu", torch.float32)
    data = tmp_path / "worst.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"worst prompt number {i}"}) + "\n" for i in range(12)))
    held = tmp_path / "worst.heldout.jsonl"
    held.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("held out one", "held out two", "worst prompt number 3")))
    from eagle_migrate import corpora

    def rendered(text: str) -> list[int]:  # as traffic_prompts renders a prompt for this tokenizer-less toy
        return corpora.render(Conversation([{"role": "user", "content": text}]), corpora.ByteTokenizer(lt.info.vocab_size))

    train, judged = traffic_prompts(lt, data, 64, 0, 256, 40)
    assert sorted(judged) == sorted(rendered(t) for t in ("held out one", "held out two", "worst prompt number 3"))
    assert len(train) == 11 and rendered("worst prompt number 3") not in train  # in both: held out only
    held.unlink()
    train2, judged2 = traffic_prompts(lt, data, 64, 0, 256, 40)
    assert len(judged2) >= 4 and len(train2) + len(judged2) == 12  # split by content, as any traffic file


def test_the_drafter_follows_its_own_target_where_the_two_differ(pair):
    """With the reference, where A's and B's greedy tokens differ on B's own text, the toy's oracle for A proposes
    A's token every time it proposes either: decided, and said; when B is A nothing differs and nothing is said."""
    f = _fit(pair, "oracle", "B", ref="A")
    fo = f.follows
    assert fo is not None and fo.decided and fo.share == 1.0 and fo.positions == fo.prefers_trained_for > 100
    # decided at the first look, so it stops there; when B is A nothing has differed by then: it stops too
    assert fo.positions <= fo.differ <= fo.drafted and fo.sequences == FOLLOW_FIRST_LOOK < FOLLOW_SEQUENCES
    assert "it drafts what its own target would write" in f.message
    same = _fit(pair, "oracle", "A", ref="A")
    assert same.follows.differ == 0 and not same.follows.decided and same.verdict == "fits"
    assert same.follows.sequences == FOLLOW_FIRST_LOOK
    assert "proposes its own target's token" not in same.message
    assert _fit(pair, "oracle", "B").follows is None  # without the reference there is nothing to compare with


def test_batched_states_read_as_one_forward_per_sequence(pair):
    """The follows measurement runs each target on a group of sequences of different lengths in one right-padded
    forward: every row's states and greedy tokens are those of the sequence's own forward; a kept one is reused."""
    from eagle_migrate.aux_evidence import batched_states, target_states

    lt = LazyTarget(str(pair["B"]), "cpu", torch.float32)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, lt.info.vocab_size, (n,), generator=g).tolist() for n in (9, 17, 5)]
    ids = [1, 2]
    lt.keep(seqs[1], {i: torch.full((17, lt.info.hidden_size), float(i)) for i in ids}, torch.arange(17))
    got = batched_states(lt, seqs, ids)
    for s, (states, nxt) in zip([seqs[0], seqs[2]], [got[0], got[2]]):
        want, wnxt = target_states(lt, s, ids)
        assert torch.equal(nxt, wnxt) and len(nxt) == len(s)
        for i in ids:
            assert torch.allclose(states[i], want[i], atol=1e-5)
    assert torch.equal(got[1][1], torch.arange(17)) and float(got[1][0][2][0, 0]) == 2.0


def _agreement(x: float) -> Agreement:
    return Agreement(target="t", agreement=x, standard_error=0.02, positions=2500, sequences=16, seconds=1.0)


def _verdict_of(b: float, a: float, share: float | None, se: float = 0.012, positions: int = 900) -> TargetFit:
    """The verdict and message of a fit whose agreements (B's text, A's) and follows share are given."""
    fo = None if share is None else Follows(positions=positions, differ=2 * positions, drafted=6000,
                                            prefers_trained_for=round(share * positions), share=share,
                                            standard_error=se, sequences=256, seconds=1.0)
    f = TargetFit(trained_for="A", served_with="B", config="other", on_target=_agreement(b), on_trained_for=_agreement(a),
                  follows=fo)
    f.verdict = target_fit._verdict(f)
    f.message = target_fit._message(f, "A")
    return f


def test_convert_stops_the_follows_measurement_once_its_action_is_known():
    """At a look: decided (3 SE from even) or the same text stop both; convert (``until="action"``) also stops at or
    above even on enough positions (stale or undecided: it recalibrates either way; only a share below even beyond
    noise, ``fits``, would change that), and reads on below even, where ``fits`` may still come; inspect reads on."""
    def fo(share: float, se: float, positions: int = 900) -> Follows:
        return Follows(positions=positions, differ=2 * positions, drafted=6000, prefers_trained_for=round(share * positions),
                       share=share, standard_error=se, sequences=64, seconds=1.0)

    stop = target_fit._stop
    assert stop(fo(0.60, 0.02), 1800, "verdict") == stop(fo(0.60, 0.02), 1800, "action") == "decided"
    assert stop(fo(0.5, 1.0, 0), 0, "verdict") == "same text"
    assert stop(fo(0.52, 0.03), 1800, "verdict") == "" and stop(fo(0.52, 0.03), 1800, "action") == "action"
    assert stop(fo(0.48, 0.03), 1800, "action") == ""  # below even: fits may still be decided
    assert stop(fo(0.9, 0.2, positions=40), 80, "action") == ""  # too few positions to say anything
    f = _verdict_of(0.44, 0.44, 0.52, 0.03)
    f.follows.stopped = "action"
    assert target_fit._verdict(f) == "undecided" and "convert stopped reading there" in target_fit._message(f, "A")


def test_an_undecided_fit_recalibrates_by_default_and_says_why():
    """convert's choice: a stale drafter and one whose fit cannot be told are both fine-tuned by default (each with
    its own reason), a fitting one on a CPU is judged only, and --no-calibrate wins over either."""
    from eagle_migrate.calibrate import CalibrationSettings
    from eagle_migrate.convert.defaults import RETARGET, RETARGET_BY, RETARGET_UNDECIDED, choose, source_kind
    from eagle_migrate.convert.registry import Traits
    kind = source_kind(toy.drafter_config(norm_before_residual=True), {}, Traits())
    assert kind.kind == "speculators-style"
    dflt = CalibrationSettings()
    stale, even, fits = (_verdict_of(0.44, 0.44, x, 0.016, positions=1343) for x in (0.56, 0.518, 0.40))
    c = choose(kind, "cpu", Traits(), None, dflt, stale)
    assert (c.run, c.judge_only, c.by, c.retarget) == (True, False, RETARGET_BY, True) and c.why.startswith(RETARGET)
    c = choose(kind, "cpu", Traits(), None, dflt, even)
    assert (c.run, c.judge_only, c.retarget) == (True, False, True) and c.why.startswith(RETARGET_UNDECIDED)
    assert "cannot tell" in c.why
    assert choose(kind, "cpu", Traits(), None, dflt, fits)[:2] == (True, True)
    assert choose(kind, "cpu", Traits(), False, dflt, even).run is False


def test_following_the_old_target_decides_stale_where_the_agreement_cannot():
    """SmolLM2's chat-format fine-tune: the agreement on B's text equals A's (0.44 against 0.44), but the source
    proposes A's token at 0.55 +- 0.015 where the two differ: stale. Within noise of even, too few positions, or
    following B: fits, and the message says which."""
    assert _verdict_of(0.44, 0.44, None).verdict == "fits"
    stale = _verdict_of(0.44, 0.44, 0.552, 0.015)
    assert stale.verdict == "stale" and "it drafts what its own target would write" in stale.message
    assert "recalibration recommended" in stale.message
    assert stale.recalibrate
    # within noise of even on enough positions: the measurement cannot tell, which is not "fits" (a coding
    # assistant's traffic on the format B: 0.518 +- 0.016, while a recalibration served +12.6 % there)
    even = _verdict_of(0.44, 0.44, 0.518, 0.016, positions=1343)
    assert even.verdict == "undecided" and even.recalibrate and not even.stale
    assert "within noise of even: cannot tell" in even.message and "--no-calibrate" in even.message
    few = _verdict_of(0.44, 0.44, 0.9, 0.02, positions=40)
    assert few.verdict == "fits" and not few.recalibrate and "too few such positions" in few.message
    follows_b = _verdict_of(0.44, 0.44, 0.27, 0.013)
    assert follows_b.verdict == "fits" and not follows_b.recalibrate
    assert "it drafts the served target's tokens" in follows_b.message
    # the agreement's drop alone still decides, whatever the share says
    assert _verdict_of(0.20, 0.44, 0.5, 0.05).verdict == "stale"
