"""Issue 49: step 0 is measured where vLLM drafts, after text the target itself wrote.

A drafter whose first draft comes from the aux states alone (``fc`` copies them, attention and MLP add nothing,
``hidden_norm`` is zero with ``norm_before_residual`` false, ``lm_head`` reads the residual) is right on the target's
own text and confidently wrong on anybody else's: scored at every position of teacher-forced data it looked dead
under every reading, and convert refused a drafter vLLM serves with every first draft right. Scored at the
continuation's positions, it drafts, and the flag is read the way it was trained. A drafter that drafts under no
reading on the target's own text is still refused, naming the flag."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate import aux_evidence as ev
from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.errors import PairingError
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.target import LazyTarget

from ..layouts import write_layout

H, K = toy.H, len(toy.AUX_IDS)


def fc_path_state_dict(dead: bool = False) -> dict[str, torch.Tensor]:
    """The toy drafter whose step-0 draft depends only on the fc path: residual g = fc(aux) = E[x_i] (x_i: the token
    at the aux states' position), lm_head reads x_i + 2, which is right where vLLM feeds the target's own token
    x_i + 1. ``dead``: lm_head reads x_i + 5 instead (wrong on any text, under any reading)."""
    sd = toy.drafter_state_dict("aux-only")
    sd["fc.weight"] = torch.cat([torch.eye(H) / (K * toy.aux_rms(i)) for i in toy.AUX_IDS], dim=1)
    sd["layers.0.mlp.down_proj.weight"] = torch.zeros(H, H)
    sd["layers.0.hidden_norm.weight"] = torch.zeros(H)
    sd["lm_head.weight"] = toy._shift(H, 5 if dead else 2)
    return sd


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("step0-own-text")
    target = str(toy.write_target(d / "target"))
    cfg = toy.drafter_config(norm_before_residual=False)
    src = _unstated(write_layout("specforge", cfg, fc_path_state_dict(), d / "fc-path"))
    dead = _unstated(write_layout("specforge", cfg, fc_path_state_dict(dead=True), d / "dead"))
    return d, target, src, dead


def _unstated(folder):
    """The config without norm_before_residual, as SpecForge's exporter writes it (the flag is then measured)."""
    f = folder / "config.json"
    cfg = json.loads(f.read_text())
    cfg.pop("norm_before_residual")
    f.write_text(json.dumps(cfg))
    return folder


def _random_text(n: int = 80, length: int = 128) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, H, (n, length), generator=g).tolist()


def test_the_fc_path_drafter_drafts_on_the_targets_own_text_only(world):
    """The planted drafter's step 0 is right at every position of the target's own continuation and at almost no
    position of text the target did not write: the measurement must score the former."""
    _, target, src, _ = world
    ck = read_checkpoint(src)
    assert ck.meta.get("norm_before_residual_stated") is False
    lt = LazyTarget(target, "cpu", torch.float32)
    from eagle_migrate.loader import load_drafter

    m = load_drafter(ck, lt.loaded, device="cpu", dtype=torch.float32)
    m.layers[0].norm_before_residual = False
    step = ev.Step0(m, H, "cpu", torch.float32)
    ids = sorted(toy.AUX_IDS)
    h = next(ev.measurement_sequences(lt, _random_text(), seed=0))
    states, nxt = ev._states(lt, h.ids, ids)
    aux = torch.cat([states[i] for i in ids], dim=-1)[: len(h.ids) - 1]
    scored = ev.drafted_positions(h, nxt)
    _, hit, keep = step(aux, h.ids, nxt[1:], scored)
    assert int(keep.sum()) >= ev.MIN_CONTINUATION and bool(hit.all())  # every first draft right where vLLM drafts
    _, hit_prompt, _ = step(aux, h.ids, nxt[1:], ~scored)
    assert hit_prompt.float().mean() < 0.2  # the prompt's own positions: not the target's text


def test_measurements_on_other_text_decide_by_the_continuations(world):
    """Given data the target did not write (random tokens), the flag is measured on the target's continuations of
    it: false wins (with true, the zero hidden_norm leaves nothing to draft from), and the aux-id reading is not
    'no evidence'. Scored at every position of the data, both were no evidence."""
    _, target, src, _ = world
    ck = read_checkpoint(src)
    lt = LazyTarget(target, "cpu", torch.float32)
    data = _random_text()
    m = ev.measure_norm_before_residual(ck, lt, sorted(toy.AUX_IDS), data=data)
    assert m.verdict == "second" and m.winner == "false", m.rule
    assert all(h.prompt_len > 1 for h in [next(ev.measurement_sequences(lt, data, seed=0))])
    cands = [sorted(toy.AUX_IDS), sorted(i + 1 for i in toy.AUX_IDS)]
    a = ev.measure(read_checkpoint(src), lt, cands, data=data)
    assert a.verdict != "no-evidence" and a.drafts["vllm"], a.rule


def test_convert_reads_the_flag_as_trained_and_keeps_the_drafts(world):
    """convert with its defaults decides norm_before_residual false by measurement and writes a drafter whose step 0
    drafts the target's own text as the source does."""
    d, target, src, _ = world
    res = convert(src, target, d / "fc-path-31", num_sequences=8, calibrate=False, command="test")
    assert res.norm_before_residual_evidence is not None and res.norm_before_residual_evidence.winner == "false"
    assert res.source_kind.kind == "plain" and res.source_kind.decided_by == "measurement"
    assert res.agreement.step0 is not None and res.agreement.step0 > 0.95


def test_a_drafter_that_drafts_under_no_reading_is_still_refused(world):
    d, target, _, dead = world
    with pytest.raises(PairingError, match="predicts none of the target's tokens") as ei:
        convert(dead, target, d / "dead-31", num_sequences=8, calibrate=False, command="test")
    assert ei.value.exit_code == 2 and "--aux-ids-convention" in ei.value.hint  # names the flag
    assert not (d / "dead-31").exists()


def test_a_large_target_continues_its_prompts_in_vllm(world, monkeypatch):
    """A target of at least VLLM_MIN_PARAMS parameters makes the measured continuations in vLLM where it is
    importable: the whole budget of prompts in one call, token ids in and out, ignore_eos; a small one (or no vLLM)
    in transformers' generate."""
    from eagle_migrate import own_text
    from eagle_migrate.engines import vllm_engine

    _, target, _, _ = world
    calls = []

    def fake(tgt, drafter, suites, **kw):
        calls.append((tgt, drafter, suites, kw))
        job = suites["own"]
        outs = [[(p[-1] + 1 + j) % H for j in range(job["max_tokens"])] for p in job["prompts"]]
        return {"own": (None, {"outputs": outs})}

    monkeypatch.setattr(vllm_engine, "measure", fake)
    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: True)
    lt = LazyTarget(target, "cpu", torch.float32)
    assert own_text.approx_params(lt.info) < own_text.VLLM_MIN_PARAMS and not own_text.in_vllm(lt)
    monkeypatch.setattr(own_text, "VLLM_MIN_PARAMS", 1)
    data = _random_text(n=80)
    got = [h for _, h in zip(range(20), ev.measurement_sequences(lt, data, seed=5))]
    assert len(calls) == 1 and calls[0][1] is None and calls[0][0] == target
    suites, kw = calls[0][2], calls[0][3]
    assert len(suites["own"]["prompts"]) == own_text.BUDGET_SEQUENCES and suites["own"]["ignore_eos"] is True
    assert kw["skip_tokenizer_init"] is True and kw["dtype"] == "float32"
    for h in got:
        assert h.prompt_len == own_text.PROMPT_TOKENS and len(h.ids) == h.prompt_len + own_text.CONTINUATION_TOKENS
        cont = h.ids[h.prompt_len - 1:]
        assert all(b == (a + 1) % H for a, b in zip(cont, cont[1:]))


def test_a_measurement_that_reads_many_takes_real_prompts_and_a_large_target_makes_them_in_one_vllm_call(world,
                                                                                                       monkeypatch):
    """A measurement that wants more sequences than the budget (the follows measurement's 256) gets them from the
    data's prompts (not perturbed copies of what was measured), replaying what an earlier, smaller measurement made; a
    small target makes them in transformers (vLLM's start does not pay there), a large one all that is still wanted
    in one vLLM call; a vLLM that fails leaves them to transformers, with a warning."""
    from eagle_migrate import own_text
    from eagle_migrate.engines import vllm_engine
    from eagle_migrate.engines.in_process import CONTINUATION_MAX_NUM_SEQS_CPU

    _, target, _, _ = world
    calls: list[int] = []
    fail = [False]

    def fake(tgt, drafter, suites, **kw):
        if fail[0]:
            raise RuntimeError("worker died")
        job = suites["own"]
        calls.append(len(job["prompts"]))
        assert kw["max_num_seqs"] == CONTINUATION_MAX_NUM_SEQS_CPU and job["ignore_eos"] is True
        outs = [[(p[-1] + 1 + j) % H for j in range(job["max_tokens"])] for p in job["prompts"]]
        return {"own": (None, {"outputs": outs})}

    monkeypatch.setattr(vllm_engine, "measure", fake)
    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: True)
    data = _random_text(n=300)

    def prompts(hs):
        return [tuple(h.ids[:h.prompt_len]) for h in hs]

    small = LazyTarget(target, "cpu", torch.float32)
    first = [h for _, h in zip(range(16), ev.measurement_sequences(small, data, seed=5))]
    many = [h for _, h in zip(range(200), ev.measurement_sequences(small, data, seed=5, want=200))]
    assert calls == [] and prompts(many[:16]) == prompts(first)  # transformers; replayed
    data_prompts = {tuple(s[:own_text.PROMPT_TOKENS]) for s in data}
    assert len(set(prompts(many))) == 200 and set(prompts(many)) <= data_prompts  # real prompts, none perturbed

    monkeypatch.setattr(own_text, "VLLM_MIN_PARAMS", 1)  # a large target
    large = LazyTarget(target, "cpu", torch.float32)
    got = [h for _, h in zip(range(200), ev.measurement_sequences(large, data, seed=5, want=200))]
    assert calls == [200] and prompts(got) == prompts(many)  # all it wants in one call, the same prompts
    for h in got:
        cont = h.ids[h.prompt_len - 1:]
        assert all(b == (a + 1) % H for a, b in zip(cont, cont[1:]))
    fail[0] = True
    again_t = LazyTarget(target, "cpu", torch.float32)
    with pytest.warns(UserWarning, match="vLLM could not generate the target's continuations"):
        again = [h for _, h in zip(range(200), ev.measurement_sequences(again_t, data, seed=5, want=200))]
    assert prompts(again) == prompts(many) and [h.ids for h in again[:16]] == [h.ids for h in first]
