"""Aux layer ids: vLLM 0.32's rule (one definition, one check), and the convention of stored ids decided by a
writer's fingerprint, by measurement on a target whose layers are distinguishable (tests/aux_world.py), or by
--aux-ids-convention; exit 2 when nothing decides."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_migrate.convert import convert, default_aux_ids
from eagle_migrate.errors import PairingError
from eagle_migrate.formats import aux_ids as A
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.inspection import inspect_checkpoint

from .. import aux_world as W
from ..layouts import AUX_DECIDED_BY, write_layout

KW = dict(num_sequences=8, command="test", calibrate=False)
# layouts whose ids nothing in the files decides (measured), and those a writer's fingerprint decides
UNDECIDED = ["vllm-plain", "specforge", "modelopt", "sharded", "model-prefix"]
FINGERPRINTED = ["vllm", "speculators", "speculators-ours"]  # vLLM's convention
FINGERPRINTED_OUTPUT = ["torchspec", "torchspec-vllm"]  # TorchSpec's code: layer outputs (kimi_k2 aside)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("aux")
    W.write_target(d / "target")
    return d


@pytest.fixture(scope="module")
def target(world) -> str:
    return str(world / "target")


# ----- vLLM 0.32's rule (read from vllm/model_executor/models/interfaces.py and llama.py; checked against vLLM's
# own classes in tests/integration/test_aux_ids_vllm.py) ---------------------------------------------------------
@pytest.mark.parametrize("layers,captured", [(32, [2, 16, 29]), (8, [2, 4, 5]), (6, [2, 3]), (4, [1, 2]), (3, [0, 1, 2]), (2, [1, 2])])
def test_vllm_default_on_small_targets(layers, captured):
    assert A.vllm_default_raw(layers) == (2, layers // 2, layers - 3)
    assert A.vllm_default_aux_ids(layers) == captured


def test_vllm_captures_sorted_unique_ids_within_0_to_L():
    assert A.vllm_captured([5, 1, 3], 6) == [1, 3, 5]  # unsorted: concatenated ascending
    assert A.vllm_captured([1, 1, 3], 6) == [1, 3]  # duplicates collapse
    assert A.vllm_captured([0, 3, 6], 6) == [0, 3, 6]  # 0 = embeddings, L = last layer's output
    assert A.vllm_captured([1, 3, 7], 6) == [1, 3]  # beyond L: never captured
    assert A.vllm_captured([-1, 1, 3], 6) == [1, 3]


def test_one_check_errors_exactly_where_vllm_captures_other_than_k_states():
    def codes(ids, t=6, k=3):
        return {f.code: f.severity for f in A.check_aux_ids(ids, k, t)}

    for ids in ([1, 3, 5], [0, 3, 6], [5, 3, 1]):
        assert len(A.vllm_captured(ids, 6)) == 3 and "error" not in codes(ids).values()
    for ids in ([1, 1, 3], [1, 3, 7], [-1, 1, 3], [1, 3]):
        assert len(A.vllm_captured(ids, 6)) != 3 and "error" in codes(ids).values()
    assert codes([0, 3, 6])["aux_id_last_layer"] == "warning"
    assert codes([5, 3, 1])["aux_ids_unsorted"] == "info"
    assert codes(None, 4)["aux_ids_default_invalid"] == "error" and codes(None, 8)["aux_ids_default"] == "info"
    # convert's default and inspect's pairing are this one rule: [1, 2] on 4 layers is refused, [2, 4, 5] on 8 kept
    with pytest.raises(PairingError, match=r"\[1, 2\]"):
        default_aux_ids(4)
    assert default_aux_ids(8) == [2, 4, 5]


def _paired(a: list[list[float]], b: list[list[float]], hits: float = 1.0, uniform: float | None = None):
    """A Paired accumulator over per-sequence log-likelihoods of two readings; ``hits``: the share of each sequence's
    positions where both readings' top-1 is the target's token (1.0: a drafter that drafts)."""
    import torch

    from eagle_migrate.aux_evidence import Paired

    p = Paired(["vllm", "output-of-layer"], uniform)
    for x, y in zip(a, b):
        h = (torch.arange(len(x)) < round(hits * len(x))).float()
        p.add({"vllm": torch.tensor(x), "output-of-layer": torch.tensor(y)}, {"vllm": h, "output-of-layer": h})
    return p


def _wobble(rows: list[list[float]], sd: float = 0.02, seed: int = 0) -> list[list[float]]:
    """Each sequence shifted by its own small offset: sequences differ, as real text does (a nonzero clustered SE)."""
    import random

    r = random.Random(seed)
    return [[v + o for v in row] for row, o in zip(rows, (r.gauss(0, sd) for _ in rows))]


def test_paired_log_likelihood_verdicts():
    """Equivalent when |d| + t SE <= the bound (checked first); winner beyond t clustered SE; otherwise inconclusive."""
    from eagle_migrate.aux_evidence import EQUIVALENCE_NATS, critical

    a = _wobble([[-1.0, -1.2] * 20] * 8)
    win = _paired(a, _wobble([[-1.5, -1.6] * 20] * 8, seed=1))
    assert win.verdict() == "first" and win.difference()[0] == pytest.approx(0.45, abs=0.05)
    assert _paired(_wobble([[-1.5] * 40] * 8), _wobble([[-1.0] * 40] * 8, seed=2)).verdict() == "second"
    same = _paired([[-1.0, -2.0] * 20] * 8, [[-1.0, -2.0] * 20] * 8)
    assert same.verdict() == "equivalent" and same.difference() == (0.0, 0.0)
    # a lead carried by one of eight sequences is not beyond three clustered standard errors, nor equivalent
    one = _paired([[-0.5] * 40] + [[-1.0] * 40] * 7, [[-1.0] * 40] * 8)
    assert one.difference()[0] == pytest.approx(0.0625) and one.verdict() == "inconclusive"
    # a tiny difference with noise: equivalent only when its t-SE interval lies inside the bound
    import random

    r = random.Random(0)
    noise = [[r.gauss(0, 0.002) for _ in range(40)] for _ in range(16)]
    tiny = _paired([[-1.0 + e for e in s] for s in noise], [[-1.0] * 40] * 16)
    d, se = tiny.difference()
    assert abs(d) + critical(15) * se <= EQUIVALENCE_NATS and tiny.verdict() == "equivalent"
    assert _paired([[-1.0]] * 1, [[-2.0]] * 1).verdict() == "inconclusive"  # one sequence: no clustered SE


def test_a_negligible_difference_is_equivalent_however_sure():
    """Both readings right everywhere and 2e-5 nats apart with a tiny SE (a toy oracle drafter in bf16): equivalent,
    never a winner decided by rounding (convert used to write output-of-layer ids from such a measurement)."""
    a = [[-3.0e-5 + 1e-7 * (i % 3) for i in range(24)] for _ in range(8)]
    b = [[-1.2e-5 + 1e-7 * ((i + s) % 5) for i in range(24)] for s in range(8)]
    p = _paired(a, b)
    d, se = p.difference()
    assert abs(d) > 10 * se > 0  # "significant"
    assert p.verdict() == "equivalent"


@pytest.mark.parametrize("case", ["dead", "uniform-and-clamp", "clamped-winner", "zero-se"])
def test_degenerate_measurements_are_no_evidence(case):
    """Planted degenerate measurements (issue 37): no reading drafts (agreement 0 under both), one reading exactly a
    uniform guess and the other at the floor (the ModelOpt and SpecForge exports' numbers), a winner that sits at the
    floor, and a zero SE with a large difference. Each is no-evidence, names why, and is never a winner."""
    import math

    from eagle_migrate.aux_evidence import LOGP_FLOOR

    n, g = 40, 8
    uniform = -math.log(1024)
    if case == "dead":  # the right token's likelihood differs, but neither reading ever drafts it
        p = _paired(_wobble([[-3.0] * n] * g), _wobble([[-9.0] * n] * g, seed=3), hits=0.0, uniform=uniform)
        why = "drafts under no reading"
    elif case == "uniform-and-clamp":
        p = _paired([[uniform] * n] * g, [[-47.9] * n] * g, hits=0.0, uniform=uniform)
        why = "drafts under no reading"
    elif case == "clamped-winner":  # agreement looks fine, but most positions of the winner are at the floor
        uniform = None  # the floor alone (the uniform rule would also catch these means)
        p = _paired([[LOGP_FLOOR] * 30 + [-0.1 - 0.01 * s] * 10 for s in range(g)],
                    [[LOGP_FLOOR] * 39 + [-0.2 + 0.01 * s] for s in range(g)], hits=0.25, uniform=uniform)
        why = "at the floor"
    else:
        p = _paired([[-1.0] * n] * g, [[-1.5] * n] * g, uniform=uniform)
        why = "zero standard error"
    assert p.verdict() == "no-evidence"
    m = p.measurement(p.verdict(), 1, 0.0)
    assert m.winner is None and m.verdict == "no-evidence" and why in m.no_evidence
    assert m.uniform == (pytest.approx(uniform) if uniform is not None else None)


def test_no_evidence_is_said_only_with_enough_positions_or_at_the_end():
    """A dead drafter whose readings are not told apart after few positions: keep measuring (inconclusive at a
    look); at the budget's end: no-evidence. A winner it does not draft under is no evidence at once."""
    p = _paired(_wobble([[-3.0] * 10] * 8, sd=1.0), _wobble([[-3.0] * 10] * 8, sd=1.0, seed=5), hits=0.0)
    assert p.positions < 256 and p.verdict() == "inconclusive" and p.verdict(final=True) == "no-evidence"
    p = _paired(_wobble([[-3.0] * 10] * 8), _wobble([[-9.0] * 10] * 8, seed=5), hits=0.0)
    assert p.positions < 256 and p.verdict() == "no-evidence"


def test_critical_values_are_students_t():
    """The per-look threshold: Student's t at one-sided 0.00135 (3 sigma) with sequences - 1 degrees of freedom;
    known quantiles (t_7 at 0.975 = 2.3646, t_1 at 0.975 = 12.706) and the normal limit."""
    from eagle_migrate.aux_evidence import critical

    assert critical(7, 0.025) == pytest.approx(2.3646, abs=1e-3)
    assert critical(1, 0.025) == pytest.approx(12.706, abs=1e-2)
    assert critical(10_000) == pytest.approx(3.0, abs=0.01)
    assert critical(7) == pytest.approx(4.53, abs=0.01) and critical(7) > critical(63) > 3.0


def test_eight_sequences_need_more_than_three_standard_errors():
    """After 8 sequences the clustered SE has 7 degrees of freedom: a 3.5-SE lead is not a winner yet."""
    import random

    r = random.Random(1)
    base = [r.gauss(0, 1) for _ in range(8)]
    mean = sum(base) / 8
    sd = (sum((x - mean) ** 2 for x in base) / 7) ** 0.5
    # standardised per-sequence differences (sd 1, so the clustered SE is 1/sqrt(8)) shifted to a 3.5-SE mean: not
    # a winner under t_7 (4.53); a 4.6-SE lead is
    diffs = [(x - mean) / sd + 3.5 / 8**0.5 for x in base]
    p = _paired([[d] * 10 for d in diffs], [[0.0] * 10] * 8)
    d, se = p.difference()
    assert d / se == pytest.approx(3.5) and p.verdict() == "inconclusive"
    win = _paired([[(x - mean) / sd + 4.6 / 8**0.5] * 10 for x in base], [[0.0] * 10] * 8)
    assert win.verdict() == "first"


def test_sequential_stops_at_the_first_look_with_a_verdict():
    import torch

    from eagle_migrate.aux_evidence import LOOKS, sequential

    calls = []

    def score(seq):
        calls.append(seq)
        return ({"a": torch.full((10,), -1.0), "b": torch.full((10,), -2.0 - 0.1 * (len(calls) % 3))},
                {"a": torch.ones(10), "b": torch.zeros(10)}, 0)

    m = sequential(["a", "b"], ([i] * 5 for i in range(100)), score)
    assert m.verdict == "first" and m.winner == "a" and len(calls) == LOOKS[0] and m.looks == 1
    assert m.positions == 10 * LOOKS[0] and m.agreement == {"a": 1.0, "b": 0.0}
    calls.clear()

    def noisy(seq):  # sign flips from sequence to sequence: never decided, the budget ends it
        calls.append(seq)
        s = 1.0 if len(calls) % 2 else -1.0
        return ({"a": torch.full((10,), -1.0 + s), "b": torch.full((10,), -1.0)}, {"a": torch.ones(10), "b": torch.ones(10)}, 0)

    m = sequential(["a", "b"], ([i] * 5 for i in range(100)), noisy)
    assert m.verdict == "inconclusive" and len(calls) == LOOKS[-1] and m.looks == len(LOOKS)


# ----- the convention, per producer layout ----------------------------------------------------------------------
@pytest.mark.parametrize("conv", ["vllm", "output-of-layer"])
@pytest.mark.parametrize("name", UNDECIDED)
def test_measurement_picks_the_convention_the_ids_were_written_in(world, target, name, conv):
    """The same weights, the ids written in either convention: the target decides which."""
    p = write_layout(name, W.drafter_config(), W.drafter_state_dict("right"), world / f"{name}-{conv}", aux_convention=conv)
    ck = read_checkpoint(p)
    assert not ck.aux.decided and ck.aux.stored == ([0, 1, 2] if conv == "output-of-layer" else [1, 2, 3])
    r = inspect_checkpoint(p, target=target)
    e = r.aux_ids_evidence
    assert (e.convention, e.decided_by) == (conv, "measurement")
    assert r.aux_layer_ids == W.IDS and r.aux_layer_ids_convention == conv
    other = "vllm" if conv == "output-of-layer" else "output-of-layer"
    assert e.measurement.agreement[conv] > 0.95 and e.measurement.agreement[other] < 0.2
    from eagle_migrate.own_text import CONTINUATION_TOKENS

    # scored on the continuations alone: most of each one's positions (the ones where the toy's greedy token was its
    # end-of-sequence id, not written under ignore_eos, are left out)
    assert e.measurement.positions >= 0.8 * e.measurement.sequences * CONTINUATION_TOKENS
    f = [x for x in r.findings if x.code == "aux_ids_measured"]
    assert f and f"{e.measurement.agreement[conv]:.3f}" in f[0].message and f"{e.measurement.agreement[other]:.3f}" in f[0].message


@pytest.mark.parametrize("name", FINGERPRINTED)
def test_fingerprint_decides_without_running_the_target(world, name):
    p = write_layout(name, W.drafter_config(), W.drafter_state_dict("right"), world / f"fp-{name}")
    cfg_only = world / f"cfg-only-{name}"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text(json.dumps(W.target_config()))
    r = inspect_checkpoint(p, target=str(cfg_only))  # no target weights: nothing to measure, nothing needed
    assert (r.aux_ids_evidence.convention, r.aux_ids_evidence.decided_by) == ("vllm", AUX_DECIDED_BY[name])
    assert r.aux_layer_ids == W.IDS and r.aux_ids_evidence.measurement is None


@pytest.mark.parametrize("name", FINGERPRINTED_OUTPUT)
def test_torchspec_fingerprint_reads_layer_outputs(world, name):
    """A TorchSpec export (native or --vllm) of a non-kimi model: _torchspec_version is TorchSpec's alone, its code
    trains on layer outputs and its exporter shifts kimi_k2 ids only, so stored [0, 1, 2] are vLLM ids [1, 2, 3],
    decided without running the target; with model_type kimi_k2 the --vllm export is already shifted."""
    p = write_layout(name, W.drafter_config(), W.drafter_state_dict("right"), world / f"fp-{name}",
                     aux_convention="output-of-layer")
    ck = read_checkpoint(p)
    assert (ck.aux.convention, ck.aux.decided_by, ck.aux.ids) == ("output-of-layer", "fingerprint", W.IDS)
    assert "layer outputs" in ck.aux.reason
    cfg = json.loads((p / "config.json").read_text())
    kimi = world / f"fp-{name}-kimi"
    shutil.copytree(p, kimi)
    (kimi / "config.json").write_text(json.dumps({**cfg, "model_type": "kimi_k2"}))
    got = read_checkpoint(kimi).aux
    assert (got.convention, got.decided_by) == ("output-of-layer" if name == "torchspec" else "vllm", "fingerprint")


def test_without_a_target_inspect_reports_the_ambiguity(world):
    p = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("right"), world / "noT", aux_convention="vllm")
    r = inspect_checkpoint(p)
    assert r.aux_layer_ids_convention == "undecided" and r.aux_layer_ids == [1, 2, 3]
    f = next(x for x in r.findings if x.code == "aux_ids_convention_ambiguous")
    assert "[1, 2, 3]" in f.message and "[2, 3, 4]" in f.message and "--aux-ids-convention" in f.message
    r = inspect_checkpoint(p, aux_ids_convention="output-of-layer")
    assert (r.aux_layer_ids, r.aux_ids_evidence.decided_by) == ([2, 3, 4], "override")


# ----- convert ---------------------------------------------------------------------------------------------------
def test_issue_case_served_ids_1_2_3_on_a_4_layer_target_convert(world, target):
    """midlayer.* + Eagle3 architecture with vLLM ids [1, 2, 3] (what vLLM serves at full AL) on a 4-layer target:
    the old reader shifted them to [2, 3, 4] and refused 'aux layer id 4 is beyond the target's 4 layers'."""
    src = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("right"), world / "issue", aux_convention="vllm")
    res = convert(src, target, world / "issue-31", **KW)
    assert res.aux_layer_ids == [1, 2, 3] and res.aux_ids_evidence.decided_by == "measurement"
    assert res.agreement.step0 == 1.0
    cfg = json.loads((world / "issue-31" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    prov = json.loads((world / "issue-31" / "provenance.json").read_text())
    m = prov["aux_ids"]["measurement"]
    assert prov["aux_ids"]["convention"] == "vllm" and m["agreement"]["vllm"] > 0.95 > 0.2 > m["agreement"]["output-of-layer"]


def test_output_of_layer_ids_reaching_the_last_layer_convert(world, target):
    """Trained on the output of layers 1, 2, 3 (vLLM ids 2, 3, 4 = L): measured, and id L is captured as vLLM does
    (before the final norm), so the converted drafter drafts exactly like the source."""
    ids = [2, 3, 4]
    src = write_layout("modelopt", W.drafter_config(ids), W.drafter_state_dict("right", ids), world / "last",
                       aux_convention="output-of-layer")
    res = convert(src, target, world / "last-31", **KW)
    assert res.aux_layer_ids == ids and res.aux_ids_evidence.convention == "output-of-layer"
    assert res.agreement.step0 == 1.0
    assert any("written as vLLM ids [2, 3, 4]" in c for c in res.changes)
    assert read_checkpoint(world / "last-31").config.aux_layer_ids == ids


def test_equivalent_readings_proceed_with_the_stored_ids_and_a_warning(world, target):
    """A drafter that reads only the embedding block (present in every state): both readings give the same step-0
    distribution at every position, so they are shown equivalent. A layout no producer's code speaks for (plain
    vLLM names): convert keeps the stored ids and says so. A SpecForge export: the ids are written in the convention
    SpecForge trains with (layer outputs), recorded as taken from the producer, not measured (issue 37)."""
    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("blind"), world / "tie", aux_convention="vllm")
    res = convert(src, target, world / "tie-31", **KW)
    e = res.aux_ids_evidence
    assert (e.decided_by, e.convention, res.aux_layer_ids) == ("equivalent", "vllm", [1, 2, 3])
    assert e.measurement.verdict == "equivalent" and e.measurement.difference == 0.0 and e.measurement.positions > 0
    assert e.measurement.drafts == {"vllm": True, "output-of-layer": True}
    assert any("serve the same here" in w for w in res.warnings)
    prov = json.loads((world / "tie-31" / "provenance.json").read_text())
    assert prov["aux_ids"]["decided_by"] == "equivalent" and prov["aux_ids"]["measurement"]["verdict"] == "equivalent"
    assert json.loads((world / "tie-31" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    sf = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("blind"), world / "tie-sf", aux_convention="vllm")
    res = convert(sf, target, world / "tie-sf-31", **KW)
    e = res.aux_ids_evidence
    assert (e.decided_by, e.convention, res.aux_layer_ids) == ("producer", "output-of-layer", [2, 3, 4])
    assert e.measurement.verdict == "equivalent" and "SGLang" in e.producer_reason
    assert any("taken from the producer, not measured" in w for w in res.warnings)
    prov = json.loads((world / "tie-sf-31" / "provenance.json").read_text())
    assert prov["aux_ids"]["decided_by"] == "producer"
    assert json.loads((world / "tie-sf-31" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    plain = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("blind"), world / "tie-i", aux_convention="vllm")
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "inspect", str(plain), "--target", target, "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["aux_ids_evidence"]["decided_by"] == "equivalent"
    assert any(f["code"] == "aux_ids_equivalent" for f in doc["findings"])


def test_inconclusive_stops_convert_with_exit_2_and_inspect_reports_it(world, target, monkeypatch):
    """Merely inconclusive (here: a budget of one sequence, too few for a clustered SE): convert stops with exit 2;
    inspect reports it."""
    from eagle_migrate import aux_evidence

    import torch

    from eagle_migrate.target import LazyTarget

    monkeypatch.setattr(aux_evidence, "sequential", _one_sequence(aux_evidence.sequential))
    src = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("right"), world / "inc", aux_convention="vllm")
    a = aux_evidence.resolve_for_target(read_checkpoint(src), LazyTarget(target, "cpu", torch.float32))
    assert not a.decided and a.measurement.verdict == "inconclusive" and a.measurement.sequences == 1
    with pytest.raises(PairingError) as ei:
        convert(src, target, world / "inc-31", **KW)
    assert "[1, 2, 3]" in ei.value.message and "[2, 3, 4]" in ei.value.message and "inconclusive" in ei.value.message
    assert "--aux-ids-convention vllm|output-of-layer" in ei.value.hint
    assert not (world / "inc-31").exists()
    # inspect changes nothing: it reports the inconclusive measurement and the flag, and never refuses
    r = inspect_checkpoint(src, target=target)
    assert r.aux_layer_ids_convention == "undecided" and r.aux_layer_ids == [1, 2, 3]  # the literal reading (vLLM's)
    assert r.aux_ids_evidence.measurement.verdict == "inconclusive"
    f = next(x for x in r.findings if x.code == "aux_ids_convention_ambiguous")
    assert f.severity == "warning" and "inconclusive" in f.message and "--aux-ids-convention" in f.message


def _one_sequence(seq_fn):
    def run(*a, **kw):
        kw["budget_sequences"] = 1
        return seq_fn(*a, **kw)
    return run


@pytest.mark.parametrize("conv,ids", [("vllm", [1, 2, 3]), ("output-of-layer", [2, 3, 4])])
def test_override_decides_and_is_recorded(world, target, conv, ids):
    src = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("blind"), world / f"ov-{conv}", aux_convention="vllm")
    out = world / f"ov-{conv}-31"
    res = convert(src, target, out, aux_ids_convention=conv, **KW)
    assert res.aux_layer_ids == ids and res.aux_ids_evidence.decided_by == "override"
    prov = json.loads((out / "provenance.json").read_text())
    assert (prov["aux_ids"]["convention"], prov["aux_ids"]["decided_by"]) == (conv, "override")
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == ids


def test_override_beats_the_measurement(world, target):
    """--aux-ids-convention overrides everything, even a clear measurement (here: the wrong reading, on purpose)."""
    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "ovm", aux_convention="vllm")
    r = inspect_checkpoint(src, target=target, aux_ids_convention="output-of-layer")
    assert (r.aux_layer_ids, r.aux_ids_evidence.decided_by, r.aux_ids_evidence.measurement) == ([2, 3, 4], "override", None)


def test_cli_flag_on_inspect(world, target):
    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("blind"), world / "cli-i", aux_convention="vllm")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    base = [sys.executable, "-m", "eagle_migrate", "inspect", str(src), "--target", target, "--json"]
    r = subprocess.run(base + ["--aux-ids-convention", "vllm"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["aux_ids_evidence"]["decided_by"] == "override" and doc["aux_layer_ids"] == [1, 2, 3]


def test_quantize_carries_undecided_ids_verbatim_without_a_target(world):
    """Quantizing keeps the layout and how vLLM reads the ids: an undecided vLLM-layout drafter is quantized as it
    is, the ids carried verbatim and marked undecided (so the output's fingerprint never claims a convention)."""
    from eagle_migrate.quantize import quantize

    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "q-src", aux_convention="vllm")
    res = quantize(src, world / "q-out", "fp8-dynamic", validate="none")
    assert any("carried verbatim" in n for n in res.notes)
    cfg = json.loads((world / "q-out" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert cfg["eagle_migrate"]["aux_ids_convention"] == "undecided" and cfg["eagle_migrate"]["aux_ids_stored"] == [1, 2, 3]
    back = read_checkpoint(world / "q-out")
    assert back.quantization and not back.aux.decided and back.aux.stored == [1, 2, 3]
    assert any("carried as they were" in e for c in back.aux.candidates for e in c.evidence)
    # a decided source keeps our plain fingerprint
    dec = write_layout("vllm", W.drafter_config(), W.drafter_state_dict("right"), world / "q-dec")
    quantize(dec, world / "q-dec-out", "fp8-dynamic", validate="none")
    assert "aux_ids_convention" not in json.loads((world / "q-dec-out" / "config.json").read_text())["eagle_migrate"]
    assert read_checkpoint(world / "q-dec-out").aux.decided_by == "fingerprint"


def test_passthrough_convert_carries_undecided_ids(world, target):
    """An EAGLE-3.1 source (passthrough) in a layout nothing fingerprints: re-written as it is, ids carried and
    marked undecided; no measurement needed."""
    cfg = W.drafter_config().model_copy(update={"fc_norm": True, "norm_output": True})
    import torch

    sd = W.drafter_state_dict("right")
    for k in range(3):
        sd[f"fc_norm.{k}.weight"] = torch.ones(W.H)
    src = write_layout("vllm-plain", cfg, sd, world / "pt", aux_convention="vllm")
    assert read_checkpoint(src).config.is_eagle31 and not read_checkpoint(src).aux.decided
    res = convert(src, target, world / "pt-out", command="test")
    assert res.passthrough and res.aux_layer_ids == [1, 2, 3] and res.aux_ids_evidence.measurement is None
    assert any("carried as stored" in w for w in res.warnings)
    out = json.loads((world / "pt-out" / "config.json").read_text())
    assert out["eagle_migrate"]["aux_ids_convention"] == "undecided"
    assert not read_checkpoint(world / "pt-out").aux.decided


def test_every_capture_takes_id_L_before_the_final_norm(world, target):
    """vLLM's id L is the last layer's output before the final norm; transformers' hidden_states[L] is after it.
    Every capture (Target.forward, Target.capture the trainer uses, LazyTarget.capture convert uses) gives vLLM's state."""
    import torch

    from eagle_migrate.target import LazyTarget, load_target

    tg = load_target(target)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    pre = {}
    h = tg.model.model.norm.register_forward_pre_hook(lambda _m, a: pre.__setitem__("x", a[0]))
    out = tg.model(input_ids=ids, output_hidden_states=True)
    h.remove()
    assert not torch.allclose(out.hidden_states[W.L], pre["x"])  # the trap
    a1, _ = tg.forward(ids, [1, W.L])
    a2, _ = tg.capture(ids, [1, W.L], torch.tensor([5]))
    a3 = next(LazyTarget(target, "cpu", torch.float32).capture([ids[0].tolist()], [1, W.L], False)).aux
    for a in (a1[0], a2[0], a3):
        assert torch.allclose(a[:, W.H:], pre["x"][0]) and torch.allclose(a[:, :W.H], out.hidden_states[1][0])


def test_aux_ids_runs_nothing():
    """aux_ids keeps vLLM's rule, the fingerprints and the types; the measurement (which runs a drafter on a target)
    lives a layer up, in aux_evidence."""
    code = ("import sys, eagle_migrate.formats.aux_ids as a; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'eagle_migrate.corpora', 'eagle_migrate.loader', "
            "'eagle_migrate.target', 'eagle_migrate.aux_evidence')))")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert not hasattr(A, "measure") and not hasattr(A, "resolve_for_target")


def test_norm_before_residual_not_in_the_config_is_measured(world, target):
    """norm_before_residual is not visible in the weights: when the config omits it, convert measures it with the
    same statistic. On this drafter (no attention or MLP output) the flag changes nothing: shown equivalent, the
    layout's default is kept, with the evidence reported. A config that states it is not measured."""
    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "nbr", aux_convention="vllm")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["norm_before_residual"]
    (src / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(src)
    assert ck.meta["norm_before_residual_stated"] is False
    res = convert(src, target, world / "nbr-31", **KW)
    m = res.norm_before_residual_evidence
    assert m is not None and m.readings == ["true", "false"] and m.verdict == "equivalent" and m.positions > 0
    assert any("norm_before_residual is not in the config" in w for w in res.warnings)
    prov = json.loads((world / "nbr-31" / "provenance.json").read_text())
    assert prov["norm_before_residual_evidence"]["verdict"] == "equivalent"
    stated = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "nbr-s", aux_convention="vllm")
    assert convert(stated, target, world / "nbr-s-31", **KW).norm_before_residual_evidence is None


def test_one_target_pass_serves_both_readings_and_the_flag_measurement(world, target):
    """The target runs once per measured sequence for both readings (the prompt and the target's own continuation of
    it, issue 49), and the norm_before_residual measurement that follows on the same sequences finds their states
    kept (it does not run the target on them again)."""
    import torch

    from eagle_migrate import aux_evidence
    from eagle_migrate.target import LazyTarget

    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "reuse", aux_convention="vllm")
    ck = read_checkpoint(src)
    lt = LazyTarget(target, "cpu", torch.float32)
    text = [[(s + 3 * i) % W.V for i in range(40)] for s in range(W.V)]  # not the target's text: only prompts
    calls = []
    tg = lt.loaded
    fwd = tg.forward
    tg.forward = lambda *a, **k: (calls.append(1), fwd(*a, **k))[1]
    m = aux_evidence.measure(ck, lt, [[1, 2, 3], [2, 3, 4]], data=text, sequences=text[:8])
    assert m.winner == "vllm" and len(calls) == m.sequences
    calls.clear()
    n = aux_evidence.measure_norm_before_residual(ck, lt, [1, 2, 3], data=text, sequences=text[:8])
    assert n.positions > 0 and len(calls) == max(0, n.sequences - m.sequences)
    h = next(aux_evidence.measurement_sequences(lt, text, 0, text[:8]))
    states, nxt = lt.kept(h.ids)
    want, logits = fwd(torch.tensor([h.ids]), [1, 2, 3])
    assert torch.allclose(torch.cat([states[i] for i in (1, 2, 3)], dim=-1), want[0].float())
    assert torch.equal(nxt, logits[0].argmax(-1))


def test_validate_serves_undecided_ids_literally_records_them_and_warns(world, target):
    """validate changes nothing: undecided ids are served as vLLM reads them (literally), recorded per drafter in the
    report, with a warning naming the other reading and how to decide; decided ids carry no warning."""
    from eagle_migrate.validate import validate

    und = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "val-und", aux_convention="vllm")
    ours = convert(und, target, world / "val-31", **KW).output  # decided by measurement: written with our mark
    logs: list[str] = []
    rep = validate(und, target, engine="reference", suites=["chat"], num_prompts=1, max_tokens=4, baseline=ours,
                   diagnostics=False, log=logs.append)
    assert rep.aux_ids["new"] == {"stored": [1, 2, 3], "served": [1, 2, 3], "convention": "undecided", "decided_by": "undecided"}
    assert rep.aux_ids["baseline"]["convention"] == "vllm" and rep.aux_ids["baseline"]["decided_by"] == "fingerprint"
    assert len(rep.warnings) == 1 and "[1, 2, 3]" in rep.warnings[0] and "[2, 3, 4]" in rep.warnings[0]
    assert f"inspect {und} --target {target}" in rep.warnings[0] and any(x.startswith("warning: new drafter") for x in logs)


def test_when_the_data_runs_out_the_targets_own_continuations_fill_the_budget(tmp_path):
    """Issue 37, item 3, and issue 49: every measured sequence is a prompt and the target's own greedy continuation
    of it (only the continuation is scored, as vLLM drafts there). A tokenizer-less target without data is prompted
    with random first tokens; on the successor toy (V = 64) those run out before the budget, so more prompts come
    from what was measured: a sequence cut at a random point, the token there replaced. Every sequence is distinct,
    reaches the budget, and its continuation is the target's greedy successor text."""
    import torch

    from eagle_migrate import aux_evidence as ev
    from eagle_migrate import toy
    from eagle_migrate.target import LazyTarget

    lt = LazyTarget(str(toy.write_target(tmp_path / "t")), "cpu", torch.float32)
    seqs = []
    for h in ev.measurement_sequences(lt, None, seed=0):
        seqs.append(h)
        if len(seqs) == ev.BUDGET_SEQUENCES:
            break
    assert len(seqs) == ev.BUDGET_SEQUENCES and len({tuple(h.ids) for h in seqs}) == len(seqs)
    assert any(h.prompt_len > 1 for h in seqs)  # the single-token starts ran out: perturbed prompts followed
    eos = toy.H - 1  # the toy's end-of-sequence id: not written where it would end the answer (ignore_eos)
    for h in seqs:
        cont = h.ids[h.prompt_len - 1:]
        assert len(cont) > ev.MIN_CONTINUATION
        assert all(b == (a + 1) % toy.H or (a + 1) % toy.H == eos for a, b in zip(cont, cont[1:])), h
        nxt = torch.tensor([(t + 1) % toy.H for t in h.ids])  # the successor target's greedy next tokens
        scored = ev.drafted_positions(h, nxt)
        own = torch.tensor([h.ids[i + 1] == (h.ids[i] + 1) % toy.H for i in range(len(h.ids) - 1)])
        assert not scored[: h.prompt_len - 1].any() and torch.equal(scored[h.prompt_len - 1:], own[h.prompt_len - 1:])
