"""One reader of a ``--hidden-states`` folder for the statistics and the calibration (issue 15): ``convert
--hidden-states`` with calibration on reads speculators' and SpecForge's layouts. Before, calibrate built
PrecomputedFeatures without the target's final norm (speculators: failed after the statistics succeeded) and globbed
SpecForge's ``*.ckpt`` only at the top level (the statistics reader searched sub-folders)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.hidden_states import iter_hidden_states
from eagle_migrate.features import PrecomputedFeatures


def _states(seq: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The toy target's exact states: after i layers the residual is 1.5^i * E[x] (E = sqrt(H) one-hot); returns the
    aux layers' states and the last layer's (pre-norm)."""
    e = torch.eye(toy.H)[seq] * math.sqrt(toy.H)
    return [e * toy.aux_rms(i) for i in toy.AUX_IDS], e * toy.aux_rms(toy.NUM_LAYERS)


def _speculators(folder: Path, seqs: list[list[int]]) -> Path:
    folder.mkdir(parents=True)
    for i, s in enumerate(seqs):
        aux, last = _states(s)
        torch.save({"input_ids": torch.tensor(s), "hidden_states": [*aux, last], "loss_mask": torch.ones(len(s), dtype=torch.long)},
                   folder / f"data_{i}.pt")
    (folder / "data_config.json").write_text(json.dumps({"version": "1", "hidden_states": {"layer_ids": [*toy.AUX_IDS, toy.NUM_LAYERS - 1]}}))
    return folder


def _specforge(folder: Path, seqs: list[list[int]]) -> Path:
    rows = folder / "rows_0-100"  # SpecForge writes sub-folders of rows
    rows.mkdir(parents=True)
    for i, s in enumerate(seqs):
        aux, last = _states(s)
        post = last / toy.aux_rms(toy.NUM_LAYERS)  # the final norm (weight ones) undoes the growth
        torch.save({"input_ids": torch.tensor(s), "loss_mask": torch.ones(len(s), dtype=torch.long),
                    "aux_hidden_state": torch.cat(aux, -1)[None], "hidden_state": post[None]}, rows / f"data_{i}.ckpt")
    return folder


WRITERS = {"speculators": _speculators, "specforge": _specforge}


@pytest.mark.parametrize("layout", list(WRITERS))
def test_one_reader_for_statistics_and_calibration(tmp_path, layout):
    seqs = toy.prompts(6, 16, seed=7)
    folder = WRITERS[layout](tmp_path / layout, seqs)
    recs = list(iter_hidden_states(folder, toy.AUX_IDS, toy.H, final_norm=(torch.ones(toy.H), 1e-6)))
    feats = PrecomputedFeatures(folder, toy.AUX_IDS, toy.H, final_norm=(torch.ones(toy.H), 1e-6))
    assert feats.layout == layout and len(feats) == len(recs) == 6
    for i, r in enumerate(recs):
        fb = feats[i]
        assert torch.equal(fb.input_ids[0], r.input_ids) and torch.allclose(fb.aux[0], r.aux.float())
        assert torch.allclose(fb.final[0], r.last.float(), atol=1e-5)
        assert torch.allclose(r.last.float(), torch.eye(toy.H)[r.input_ids] * math.sqrt(toy.H), atol=1e-4)  # post-norm


@pytest.mark.parametrize("layout", list(WRITERS))
def test_convert_with_hidden_states_calibrates(tmp_path, toy_target, toy_oracle, layout):
    seqs = [p + [(p[-1] + i) % toy.H for i in range(1, 13)] for p in toy.prompts(8, 4, seed=11)]
    folder = WRITERS[layout](tmp_path / layout, seqs)
    res = convert(toy_oracle, str(toy_target), tmp_path / "out", hidden_states_dir=folder, num_sequences=8,
                  command="test", calibrate=True, steps=2)
    assert res.norm_init.statistics.num_sequences > 0 and res.agreement.step0 == 1.0
    assert res.calibration.status == "calibrated"
    assert res.calibration.details["tokens_seen"] > 0


def test_layer_ids_are_checked_for_calibration_too(tmp_path):
    folder = _speculators(tmp_path / "sp", toy.prompts(2, 8))
    with pytest.raises(Exception, match="needs"):
        PrecomputedFeatures(folder, [0, 2, 4], toy.H, final_norm=(torch.ones(toy.H), 1e-6))


def test_specforge_last_state_evidence(tmp_path):
    """SpecForge records no layer ids (issue 29): its post-norm ``hidden_state`` must predict the next tokens through
    the target's lm_head at least as well as any aux chunk, else the folder is refused naming the file."""
    from eagle_migrate.errors import DataError
    from eagle_migrate.hidden_states import check_last_slice

    seqs = [p + [(p[-1] + i) % toy.H for i in range(1, 13)] for p in toy.prompts(2, 4, seed=3)]
    folder = _specforge(tmp_path / "sf", seqs)
    norm, lm_head = (torch.ones(toy.H), 1e-6), toy.target_state_dict()["lm_head.weight"]
    ev = check_last_slice(folder, norm, lm_head)
    assert ev is not None and ev.ok and len(ev.accuracy) == 4 and ev.accuracy[-1] > 0.5
    f = sorted(folder.rglob("*.ckpt"))[0]
    d = torch.load(f, weights_only=True)
    d["hidden_state"] = torch.randn(d["hidden_state"].shape, generator=torch.Generator().manual_seed(0))
    torch.save(d, f)
    with pytest.raises(DataError, match="the last slice is not the target's last layer"):
        check_last_slice(folder, norm, lm_head)
