"""Degenerate target statistics (issue 16.2): collinear or zero aux states never crash the conversion; the fits
they leave undetermined are dropped with a warning, and the per-layer mean-RMS initialisation stands in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.write import write_vllm
from eagle_migrate.stats import StatsAccumulator, solve_psd

LAYERS = 8
IDS = [2, 4, 5]


def _target(path: Path, mode: str) -> str:
    """The successor toy target with ``identical`` aux layers (every MLP adds nothing: the residual stream is the
    embedding at every depth) or ``zero`` aux states (a zero embedding as well)."""
    sd = toy.target_state_dict(layers=LAYERS)
    for i in range(LAYERS):
        sd[f"model.layers.{i}.mlp.down_proj.weight"] = torch.zeros(toy.H, toy.H)
    if mode == "zero":
        sd["model.embed_tokens.weight"] = torch.zeros(toy.H, toy.H)
    path.mkdir(parents=True, exist_ok=True)
    save_safetensors(sd, path / "model.safetensors", {"format": "pt"})
    write_json(path / "config.json", toy.target_config(layers=LAYERS))
    return str(path)


def _source(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    write_vllm(toy.drafter_config().model_copy(update={"aux_layer_ids": IDS}), toy.drafter_state_dict("oracle"), path,
               dtype=torch.float32)
    return path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_identical_aux_layers_convert_with_mean_rms_and_a_warning(tmp_path, dtype):
    res = convert(_source(tmp_path / "src"), _target(tmp_path / "t", "identical"), tmp_path / "out", num_sequences=8,
                  command="test", calibrate=False, dtype=dtype)
    methods = [c.method for c in res.norm_init.candidates]
    assert not {"lstsq-scalar", "lstsq-channel", "lstsq-scalar-relative", "lstsq-channel-relative"} & set(methods)
    assert "mean-rms" in methods and res.norm_init.method == "mean-rms"
    assert len(res.norm_init.warnings) == 2 and all("collinear (rank 1 of 3" in w for w in res.norm_init.warnings)
    assert any("collinear" in w and "mean-RMS" in w for w in res.warnings)
    # every aux layer is the embedding (RMS 1): mean-rms is exact, and the drafter stays the exact oracle
    assert [w.mean for w in res.norm_init.fc_norm] == pytest.approx([1.0, 1.0, 1.0], rel=1e-2)
    assert res.agreement.step0 == 1.0 and res.agreement.steps == [1.0, 1.0, 1.0]


def test_zero_aux_states_do_not_crash(tmp_path):
    """Zero aux states made torch.linalg.solve raise LinAlgError ('a bug in eagle-migrate')."""
    res = convert(_source(tmp_path / "src"), _target(tmp_path / "t", "zero"), tmp_path / "out", num_sequences=8,
                  command="test", calibrate=False, dtype="float32")
    assert any("zero" in w for w in res.norm_init.warnings)
    assert not [c for c in res.norm_init.candidates if c.method.startswith("lstsq-scalar")]
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_solve_psd_is_the_least_squares_solution_on_singular_systems():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(50, 1, generator=g, dtype=torch.float64).repeat(1, 3) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    z = torch.randn(50, generator=g, dtype=torch.float64)
    x, rank = solve_psd(y.T @ y, y.T @ z)
    assert rank == 1
    ref = torch.linalg.pinv(y) @ z  # the minimum-norm least-squares solution
    assert torch.allclose(x, ref, rtol=1e-8, atol=1e-10)
    assert solve_psd(torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)) == (None, 0)
    full, rank = solve_psd(y.T @ y + torch.eye(3, dtype=torch.float64), y.T @ z)
    assert rank == 3 and torch.allclose(full, torch.linalg.solve(y.T @ y + torch.eye(3, dtype=torch.float64), y.T @ z))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_collinear_accumulator_keeps_determined_fits(dtype):
    """Identical aux chunks through an fc with proportional chunks: the scalar fits are undetermined (dropped with a
    warning); the per-channel statistics are still computed."""
    gen = torch.Generator().manual_seed(2)
    ht, k = 16, 3
    base = torch.randn(8, ht, generator=gen)
    fc = torch.cat([base / s for s in (1.0, 2.0, 4.0)], 1).to(dtype)
    acc = StatsAccumulator([1, 2, 3], ht, eps=1e-6, fc_weight=fc)
    for _ in range(3):
        acc.update(torch.randn(10, ht, generator=gen).repeat(1, k).to(dtype))
    f = acc.fits()
    assert {"ones", "mean-rms", "median-rms", "channel-rms", "lstsq-channel-independent"} <= set(f.candidates)
    assert "lstsq-scalar" not in f.candidates and "lstsq-channel" not in f.candidates
    assert len(f.warnings) == 2 and f.notes["lstsq-scalar"].startswith("skipped")
