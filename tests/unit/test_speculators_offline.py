"""Issue 29: ``--hidden-states`` reads speculators >= 0.9's offline folder as its pipeline writes it
(``prepare-data`` arrow dataset + ``hidden_states/hs_{i}.safetensors`` with ``hidden_states`` [T, K+1, H] and
``token_ids``) and never loads the target whole. Before, ``convert --hidden-states`` exited 2 on ``hs_0.safetensors``
("not an eagle-migrate feature file") and calibration loaded the whole target.

The folders here are the toy target's exact states written in that layout with the same libraries speculators uses
(``datasets``' save_to_disk, safetensors); tests/fixtures/speculators-offline is the one its own pipeline wrote
(benchmarks/speculators_offline_fixture.sh), read in test_fixture_as_written."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
from safetensors.torch import load_file, save_file  # noqa: E402

from eagle_migrate import toy  # noqa: E402
from eagle_migrate.errors import DataError  # noqa: E402
from eagle_migrate.features import PrecomputedFeatures  # noqa: E402
from eagle_migrate.hidden_states import check_last_slice, describe_hidden_states, iter_hidden_states  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "speculators-offline"


def _states(seq: list[int]) -> torch.Tensor:
    """[T, K+1, H]: the toy target's aux layers (1, 3, 5) then its last layer L = 6 before the final norm."""
    e = torch.eye(toy.H)[seq] * math.sqrt(toy.H)
    return torch.stack([e * toy.aux_rms(i) for i in [*toy.AUX_IDS, toy.NUM_LAYERS]], 1)


def write_offline(folder: Path, seqs: list[list[int]], prompt: int = 4) -> Path:
    """The prepare-data folder (arrow dataset: input_ids, loss_mask) with hidden_states/hs_{i}.safetensors."""
    masks = [[0] * prompt + [1] * (len(s) - prompt) for s in seqs]
    datasets.Dataset.from_dict({"input_ids": seqs, "loss_mask": masks}).save_to_disk(str(folder))
    (folder / "hidden_states").mkdir()
    for i, s in enumerate(seqs):
        save_file({"hidden_states": _states(s).to(torch.bfloat16).contiguous(), "token_ids": torch.tensor(s)},
                  str(folder / "hidden_states" / f"hs_{i}.safetensors"))
    return folder


def _seqs(n: int = 10) -> list[list[int]]:
    return [p + [(p[-1] + i) % toy.H for i in range(1, 13)] for p in toy.prompts(n, 4, seed=11)]


def headless_target(src: Path, out: Path) -> Path:
    """The toy target sharded as large targets are (model.safetensors.index.json), with the decoder layers' shard
    unreadable (garbage bytes): transformers cannot load it; only the shard with the embedding, final norm and
    lm_head is readable."""
    out.mkdir(parents=True)
    sd = load_file(str(src / "model.safetensors"))
    layers = {n: t for n, t in sd.items() if ".layers." in n}
    borrowed = {n: t for n, t in sd.items() if n not in layers}
    save_file(borrowed, str(out / "model-00001-of-00002.safetensors"), {"format": "pt"})
    (out / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 4096)  # the layers: unreadable
    wm = {**dict.fromkeys(borrowed, "model-00001-of-00002.safetensors"), **dict.fromkeys(layers, "model-00002-of-00002.safetensors")}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    (out / "config.json").write_text((src / "config.json").read_text())
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "eagle_migrate", *args], capture_output=True, text=True, env=env, timeout=600)


def test_reads_the_layout_as_written(tmp_path):
    seqs = _seqs(3)
    folder = write_offline(tmp_path / "ds", seqs)
    info = describe_hidden_states(folder)
    assert info.layout == "speculators-offline" and info.dataset == folder and len(info.files) == 3
    assert describe_hidden_states(folder / "hidden_states").dataset == folder  # the hidden_states folder itself too
    norm = (torch.ones(toy.H), 1e-6)
    recs = list(iter_hidden_states(folder, toy.AUX_IDS, toy.H, final_norm=norm, num_layers=toy.NUM_LAYERS))
    for s, r in zip(seqs, recs, strict=True):
        st = _states(s).to(torch.bfloat16)
        assert r.input_ids.tolist() == s and torch.equal(r.aux, st[:, :3].reshape(len(s), -1))
        assert r.loss_mask.tolist() == [0] * 4 + [1] * (len(s) - 4)
        assert torch.allclose(r.last, torch.eye(toy.H)[s] * math.sqrt(toy.H), atol=0.05)  # through the final norm
    feats = PrecomputedFeatures(folder, toy.AUX_IDS, toy.H, final_norm=norm, num_layers=toy.NUM_LAYERS, indices=[2])
    assert len(feats) == 1 and feats[0].input_ids[0].tolist() == seqs[2]


def test_last_slice_evidence(tmp_path):
    folder = write_offline(tmp_path / "ds", _seqs(2))
    norm = (torch.ones(toy.H), 1e-6)
    lm_head = toy.target_state_dict()["lm_head.weight"]
    ev = check_last_slice(folder, norm, lm_head)
    assert ev is not None and ev.ok and ev.accuracy[-1] > 0.5
    # a last slice that is not the target's last layer (noise): refused, naming the file
    f = folder / "hidden_states" / "hs_0.safetensors"
    d = load_file(str(f))
    d["hidden_states"][:, -1] = torch.randn(d["hidden_states"].shape[0], toy.H, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file(d, str(f))
    with pytest.raises(DataError, match="hs_0.safetensors: the last slice is not the target's last layer"):
        check_last_slice(folder, norm, lm_head)


def test_converts_without_the_targets_layers(tmp_path, toy_target, toy_oracle):
    """--hidden-states never loads the target: a target folder without decoder layers converts, statistics,
    agreement and calibration (held-out from the folder's own files) included."""
    folder = write_offline(tmp_path / "ds", _seqs(10))
    headless = headless_target(Path(toy_target), tmp_path / "headless")
    out = tmp_path / "nocal"
    r = cli("convert", str(toy_oracle), "--target", str(headless), "-o", str(out), "--hidden-states", str(folder),
            "--no-calibrate", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["agreement"]["step0"] == 1.0 and doc["norm_init"]["statistics"]["num_sequences"] > 0
    assert "last slice verified" in doc["provenance"]["hidden_states_evidence"]
    out = tmp_path / "cal"
    r = cli("convert", str(toy_oracle), "--target", str(headless), "-o", str(out), "--hidden-states", str(folder),
            "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    cal = json.loads(r.stdout)["calibration"]
    assert cal["status"] == "calibrated" and "files" in cal["details"]["suites"]
    assert cal["details"]["suites"]["files"]["before"]["acceptance_length"] > 1.0
    assert any("greedy continuations" in m for m in cal["details"]["not_measured"])
    # and the headless target really cannot be loaded
    from eagle_migrate.target import load_target
    with pytest.raises(Exception):
        load_target(str(headless))


def _truncate(f: Path) -> None:
    b = f.read_bytes()
    f.write_bytes(b[: len(b) // 2])


def _retokenise(folder: Path) -> None:
    f = folder / "hidden_states" / "hs_1.safetensors"
    d = load_file(str(f))
    d["token_ids"] = d["token_ids"].clone()
    d["token_ids"][5] = (d["token_ids"][5] + 1) % toy.H
    save_file(d, str(f))


def _slices(folder: Path, keep: int) -> None:
    f = folder / "hidden_states" / "hs_0.safetensors"
    d = load_file(str(f))
    save_file({"hidden_states": d["hidden_states"][:, -keep:].contiguous(), "token_ids": d["token_ids"]}, str(f))


def _width(folder: Path) -> None:
    f = folder / "hidden_states" / "hs_0.safetensors"
    d = load_file(str(f))
    save_file({"hidden_states": d["hidden_states"][..., : toy.H // 2].contiguous(), "token_ids": d["token_ids"]}, str(f))


def _nan(folder: Path) -> None:
    f = folder / "hidden_states" / "hs_2.safetensors"
    d = load_file(str(f))
    d["hidden_states"][3, 1, 7] = float("nan")
    save_file(d, str(f))


def _other_producer(folder: Path) -> None:
    f = folder / "hidden_states" / "hs_0.safetensors"
    d = load_file(str(f))
    save_file({"aux_hidden_states": d["hidden_states"][:, :3].contiguous(), "input_ids": d["token_ids"]}, str(f))


BAD = {
    "missing": (lambda d: (d / "hidden_states" / "hs_1.safetensors").unlink(), "hs_1.safetensors: missing"),
    "truncated": (lambda d: _truncate(d / "hidden_states" / "hs_1.safetensors"), "hs_1.safetensors: not a readable safetensors file"),
    "token-ids": (_retokenise, "hs_1.safetensors: token_ids disagree with row 1"),
    "layer-count": (lambda d: _slices(d, 3), "hs_0.safetensors: 3 layer slices"),
    "width": (_width, "hs_0.safetensors: hidden states are 32 wide"),
    "nan": (_nan, "hs_2.safetensors: hidden states hold NaN/Inf"),
    "other-producer": (_other_producer, "hs_0.safetensors: not a speculators hidden-states file"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_folders_exit_2_naming_the_file(tmp_path, toy_target, toy_oracle, case):
    folder = write_offline(tmp_path / "ds", _seqs(6))
    spoil, msg = BAD[case]
    spoil(folder)
    out = tmp_path / "out"
    r = cli("convert", str(toy_oracle), "--target", str(toy_target), "-o", str(out), "--hidden-states", str(folder),
            "--no-calibrate")
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error:")]) == 1
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_another_producers_feature_files(tmp_path, toy_target, toy_oracle):
    """Safetensors files of another layout at the top level (no hs_ names): one line naming the file."""
    folder = tmp_path / "other"
    folder.mkdir()
    save_file({"hidden_states": torch.zeros(4, 3, toy.H), "input_ids": torch.arange(4)}, str(folder / "sample0.safetensors"))
    r = cli("convert", str(toy_oracle), "--target", str(toy_target), "-o", str(tmp_path / "out"), "--hidden-states", str(folder),
            "--no-calibrate")
    assert r.returncode == 2 and "sample0.safetensors: not an eagle-migrate feature file" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="tests/fixtures/speculators-offline not generated")
def test_fixture_as_written():
    """The folder speculators' own prepare-data + generate-offline-data wrote through vLLM (SmolLM2-135M, cut to a few
    rows): layout, shapes and the dataset rows as written; the layer evidence needs the real target (slow test)."""
    info = describe_hidden_states(FIXTURE)
    assert info.layout == "speculators-offline" and len(info.files) >= 2
    d = load_file(str(info.files[0]))
    t, s, h = d["hidden_states"].shape
    assert (s, h) == (4, 576) and d["hidden_states"].dtype == torch.bfloat16 and d["token_ids"].shape == (t,)
    recs = list(iter_hidden_states(FIXTURE, [2, 15, 27], 576, final_norm=(torch.ones(576), 1e-5), num_layers=30))
    assert len(recs) == len(info.files) and recs[0].aux.shape == (t, 3 * 576) and recs[0].loss_mask is not None


@pytest.mark.slow
@pytest.mark.skipif(not FIXTURE.is_dir(), reason="tests/fixtures/speculators-offline not generated")
def test_fixture_layers_by_evidence_on_smollm2():
    """The fixture's last slice, through SmolLM2's final norm and lm_head (read lazily, the model never built), is
    the slice that predicts the text best; and (SmolLM2 fits) every slice is the layer the rule says against a
    fresh transformers capture of the same tokens, within bf16 rounding."""
    from eagle_migrate import assets
    from eagle_migrate.target import TargetWeights, check_against_capture, load_target

    tw = TargetWeights(str(assets.smollm2_target()))
    norm = (tw.final_norm_weight, tw.info.rms_norm_eps)
    ev = check_last_slice(FIXTURE, norm, tw.lm_head_weight)
    assert ev is not None and ev.ok and ev.accuracy[-1] > 0.2 and ev.accuracy[-1] > ev.accuracy[0]
    errs = check_against_capture(load_target(str(assets.smollm2_target())), FIXTURE, [2, 15, 27])
    assert max(errs) < 0.05, errs


def test_aux_slices_against_a_fresh_capture(tmp_path, toy_target):
    """Where the target fits: the slices of a file against the target's own capture of the same tokens; slices in
    another order are refused naming the file and the slice."""
    from eagle_migrate.target import check_against_capture, load_target

    folder = write_offline(tmp_path / "ds", _seqs(2))
    tg = load_target(str(toy_target))
    errs = check_against_capture(tg, folder, toy.AUX_IDS)
    assert len(errs) == 4 and max(errs) < 0.01
    f = folder / "hidden_states" / "hs_0.safetensors"
    d = load_file(str(f))
    d["hidden_states"] = d["hidden_states"][:, [1, 0, 2, 3]].contiguous()  # layers 3 and 1 swapped
    save_file(d, str(f))
    with pytest.raises(DataError, match="hs_0.safetensors: slice 0 is not layer 1"):
        check_against_capture(tg, folder, toy.AUX_IDS)
