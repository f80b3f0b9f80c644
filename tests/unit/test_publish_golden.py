"""Golden files for what publish generates: the model card, speculative_config.json and the serving commands.

The fixture is a toy EAGLE-3.1 drafter written with fixed metadata (so file sizes do not depend on the tool
version), a provenance.json and a validation report with a tiny plot. The tool version is replaced by
``{VERSION}`` before comparing.

Regenerate after an intended change, then review the diff:

    EAGLE_MIGRATE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_publish_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from eagle_migrate import __version__, toy
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.vllm import vllm_config_dict
from eagle_migrate.publish import publish

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = os.environ.get("EAGLE_MIGRATE_UPDATE_GOLDEN", "") not in ("", "0")
# a valid 1x1 PNG
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e2262fa90000000049454e44ae426082"
)


def build_fixture(root: Path) -> tuple[Path, Path]:
    ck = root / "ckpt"
    ck.mkdir(parents=True)
    cfg = toy.drafter_config(fc_norm=True, norm_output=True)
    sd = toy.drafter_state_dict("oracle")
    for k, i in enumerate(toy.AUX_IDS):
        sd[f"fc_norm.{k}.weight"] = torch.full((toy.H,), toy.aux_rms(i))
    save_safetensors({k: v.to(torch.bfloat16) for k, v in sorted(sd.items())}, ck / "model.safetensors", {"format": "pt"})
    d = vllm_config_dict(cfg)
    d.pop("eagle_migrate")
    write_json(ck / "config.json", d)
    write_json(ck / "provenance.json", {
        "source": {"path": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "format": "eagle3", "producer": "safeailab"},
        "target": "meta-llama/Llama-3.1-8B-Instruct",
        "license": "llama3.1",
        "convert": {"fc_norm_init": "target-rms", "calibration_steps": 200},
    })
    rep = root / "report"
    rep.mkdir()
    write_json(rep / "report.json", {
        "passed": True, "engine": "vllm", "vllm_version": "0.32.0", "num_speculative_tokens": 3, "temperature": 0.0,
        "suites": [
            {"suite": "chat", "acceptance_length": 2.84, "baseline_acceptance_length": 2.81, "change_pct": 1.1,
             "per_position_rate": [0.81, 0.62, 0.41], "num_drafts": 900, "outputs": [[1, 2]]},
            {"suite": "template-shift", "acceptance_length": 2.52, "baseline_acceptance_length": 1.94, "change_pct": 29.9,
             "per_position_rate": [0.74, 0.5, 0.28]},
        ],
        "gates": [
            {"name": "min_acceptance_length", "passed": True, "value": 2.52, "threshold": 2.0},
            {"name": "max_regression", "passed": True, "message": "no suite below the baseline by more than 5%"},
        ],
    })
    (rep / "acceptance.png").write_bytes(PNG)
    return ck, rep


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    ck, rep = build_fixture(root)
    res = publish(ck, "my-org/llama31-8b-eagle3.1", report_dir=rep, dry_run=True, out_dir=root / "out")
    (root / "out-commands.json").write_text(json.dumps(
        {"commit_message": res.commit_message, "vllm_serve": res.vllm_serve, "sglang_args": res.sglang_args}, indent=2) + "\n")
    return root


def normalise(text: str) -> str:
    return text.replace(__version__, "{VERSION}")


@pytest.mark.parametrize("name,golden", [
    ("out/README.md", "model_card.md"),
    ("out/speculative_config.json", "speculative_config.json"),
    ("out-commands.json", "commands.json"),
])
def test_golden(published, name, golden):
    got = normalise((published / name).read_text(encoding="utf-8"))
    path = GOLDEN / golden
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.is_file(), f"{path} missing: run with EAGLE_MIGRATE_UPDATE_GOLDEN=1"
    assert got == path.read_text(encoding="utf-8"), f"{golden} changed: review, then EAGLE_MIGRATE_UPDATE_GOLDEN=1"


def test_golden_serve_line_is_the_file(published):
    import shlex

    cmd = json.loads((published / "out-commands.json").read_text())["vllm_serve"]
    argv = shlex.split(cmd)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"] and argv[3] == "--speculative-config"
    assert json.loads(argv[4]) == json.loads((published / "out" / "speculative_config.json").read_text())
