"""Every rope type transformers and vLLM know converts, calibrates and validates (issue 16.2b: a scaled rope crashed
``convert --no-calibrate`` with "Cannot copy out of meta tensor"). The frequencies themselves are compared with
vLLM's in tests/integration/test_rope_vllm.py, and one drafted step with vLLM in test_equivalence_vllm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.drafter.model import EagleDrafter
from eagle_migrate.drafter.rope import ROPE_TYPES
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.write import write_vllm
from eagle_migrate.validate.api import validate

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 256,
                 "short_factor": [1.0] * (toy.HEAD_DIM // 2), "long_factor": [4.0] * (toy.HEAD_DIM // 2)},
}


def test_every_known_rope_type_is_listed():
    assert set(ROPES) == set(ROPE_TYPES)


def _pair(root: Path, rope: dict | None) -> tuple[Path, str]:
    """The toy successor target and its oracle drafter, both with ``rope`` (convert takes the target's rope)."""
    t = root / "target"
    t.mkdir(parents=True)
    save_safetensors(toy.target_state_dict(), t / "model.safetensors", {"format": "pt"})
    tc = toy.target_config()
    if rope:
        tc["rope_scaling"] = rope
    write_json(t / "config.json", tc)
    src = root / "src"
    src.mkdir()
    write_vllm(toy.drafter_config(rope_scaling=rope), toy.drafter_state_dict("oracle"), src, dtype=torch.float32)
    return src, str(t)


@pytest.mark.parametrize("name", list(ROPES))
def test_rope_type_converts_calibrates_and_validates(tmp_path, name):
    src, target = _pair(tmp_path, ROPES[name])
    with torch.device("meta"):
        m = EagleDrafter(read_checkpoint(src).config)
    assert m._inv_freq.device.type == "cpu" and torch.isfinite(m._inv_freq).all()
    res = convert(src, target, tmp_path / "out", num_sequences=8, command="test", calibrate=True, steps=2)
    assert res.calibration.status == "calibrated"
    assert res.agreement.step0 == 1.0 and res.agreement.steps == [1.0, 1.0, 1.0]
    ck = read_checkpoint(tmp_path / "out")
    assert ck.config.fc_norm and (ck.config.rope_scaling or None) == ROPES[name]
    rep = validate(tmp_path / "out", target, engine="reference", suites=["chat"], num_prompts=2, max_tokens=12, k=3)
    assert rep.suites[0].new.acceptance_length == pytest.approx(4.0)  # the oracle, exact
