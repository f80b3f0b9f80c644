"""Aux layer ids: vLLM 0.32's rule (one definition, one check), and the convention of stored ids decided by a
writer's fingerprint, by measurement on a target whose layers are distinguishable (tests/aux_world.py), or by
--aux-ids-convention; exit 2 when nothing decides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_migrate import aux_ids as A
from eagle_migrate.convert import convert, default_aux_ids
from eagle_migrate.errors import PairingError
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.inspection import inspect_checkpoint

from .. import aux_world as W
from ..layouts import AUX_DECIDED_BY, write_layout

KW = dict(num_sequences=8, command="test", calibrate=False)
# layouts whose ids nothing in the files decides (measured), and those a writer's fingerprint decides
UNDECIDED = ["vllm-plain", "specforge", "modelopt", "torchspec", "torchspec-vllm", "sharded", "model-prefix"]
FINGERPRINTED = ["vllm", "speculators", "speculators-ours"]


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


def test_clear_winner_needs_margin_and_standard_errors():
    one = A.measurement_from_hits({"vllm": [[1] * 40] * 8, "output-of-layer": [[0] * 40] * 8})
    assert A.clear_winner(one) == "vllm" and one.difference == 1.0
    tie = A.measurement_from_hits({"vllm": [[1, 0] * 20] * 8, "output-of-layer": [[1, 0] * 20] * 8})
    assert A.clear_winner(tie) is None
    # a 4-point lead is below the margin however many positions
    small = A.measurement_from_hits({"vllm": [[1] * 100] * 8, "output-of-layer": [[1] * 96 + [0] * 4] * 8})
    assert small.difference == pytest.approx(0.04) and A.clear_winner(small) is None
    # a lead concentrated in one of eight sequences is not beyond three clustered standard errors
    noisy = A.measurement_from_hits({"vllm": [[1] * 40] + [[0] * 40] * 7, "output-of-layer": [[0] * 40] * 8})
    assert noisy.difference == pytest.approx(0.125) and A.clear_winner(noisy) is None


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
    assert e.measurement.positions >= 300
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


def test_tie_stops_with_exit_2_naming_both_readings_and_the_flag(world, target):
    src = write_layout("specforge", W.drafter_config(), W.drafter_state_dict("blind"), world / "tie", aux_convention="vllm")
    with pytest.raises(PairingError) as ei:
        convert(src, target, world / "tie-31", **KW)
    assert "[1, 2, 3]" in ei.value.message and "[2, 3, 4]" in ei.value.message
    assert "--aux-ids-convention vllm|output-of-layer" in ei.value.hint
    assert not (world / "tie-31").exists()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "convert", str(src), "--target", target, "-o", str(world / "tie-cli"),
                        "--no-calibrate", "-n", "8", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2
    doc = json.loads(r.stdout)  # --json: the failure is one JSON document on stdout
    assert doc["error"]["exit_code"] == 2 and "--aux-ids-convention" in doc["error"]["hint"]
    assert "[2, 3, 4]" in r.stderr and "--aux-ids-convention" in r.stderr


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
    r = subprocess.run(base, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "--aux-ids-convention" in r.stderr
    r = subprocess.run(base + ["--aux-ids-convention", "vllm"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["aux_ids_evidence"]["decided_by"] == "override" and doc["aux_layer_ids"] == [1, 2, 3]


def test_quantize_refuses_an_undecided_source(world):
    """quantize's output carries our fingerprint (vLLM ids): an undecided reading is refused, not laundered into it."""
    from eagle_migrate.errors import InputError
    from eagle_migrate.quantize import quantize

    src = write_layout("vllm-plain", W.drafter_config(), W.drafter_state_dict("right"), world / "q-src", aux_convention="vllm")
    with pytest.raises(InputError, match="two ways") as ei:
        quantize(src, world / "q-out", "fp8-dynamic", validate="none")
    assert "convert" in ei.value.hint and not (world / "q-out").exists()


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
