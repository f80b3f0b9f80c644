"""inspect: report fields for every layout, each finding on a checkpoint built to trigger it, headers-only reading,
and the CLI (--help, --json, exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eagle_migrate import toy
from eagle_migrate.formats.output import write_json
from eagle_migrate.inspection import InspectReport, inspect_checkpoint

from ..layouts import AUX_CONVENTION, AUX_DECIDED_BY, AUX_DECIDED_CONVENTION, EXPECTED, LAYOUT_NAMES, canonical_state_dict, write_layout
from .test_formats import BIG, NO_BIG


def _codes(r: InspectReport, severity: str | None = None) -> set[str]:
    return {f.code for f in r.findings if severity is None or f.severity == severity}


@pytest.fixture
def target(tmp_path) -> Path:
    """The toy target's config only (pairing checks never read target weights)."""
    p = tmp_path / "target"
    p.mkdir()
    write_json(p / "config.json", toy.target_config())
    return p


def _cfg_edit(p: Path, **kv) -> Path:
    c = json.loads((p / "config.json").read_text())
    for k, v in kv.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    write_json(p / "config.json", c)
    return p


def _toy(tmp_path, name="vllm-plain", sd=None, cfg=None, **cfg_update) -> Path:
    cfg = cfg or toy.drafter_config()
    if cfg_update:
        cfg = cfg.model_copy(update=cfg_update)
    return write_layout(name, cfg, sd if sd is not None else toy.drafter_state_dict("oracle"), tmp_path / f"{name}-d")


# ----- every layout ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_report_every_layout(tmp_path, name):
    cfg = toy.drafter_config()
    r = inspect_checkpoint(write_layout(name, cfg, toy.drafter_state_dict("oracle"), tmp_path / name))
    exp = EXPECTED[name]
    assert (r.layout, r.producer) == (exp["layout"], exp["producer"])
    assert r.format == (exp["format"] or "eagle3")
    s = r.sizes
    assert (s.hidden_size, s.vocab_size, s.draft_vocab_size, s.num_layers) == (64, 64, 64, 1)
    if r.format == "eagle2":
        assert s.num_aux == 2 and s.intermediate_size == 64
    elif name != "mla":
        assert (s.target_hidden_size, s.num_aux, s.intermediate_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim) == (64, 3, 64, 2, 1, 32)
    assert r.num_parameters > 0 and r.files and r.total_bytes > 0
    if name.startswith("quantized"):
        assert r.quantization and r.quantization["quant_method"] == ("modelopt" if "modelopt" in name else "compressed-tensors")
    else:
        assert r.quantization is None
    json.loads(r.model_dump_json())


@pytest.mark.parametrize("name", [n for n in LAYOUT_NAMES if n not in NO_BIG])
def test_report_every_layout_every_size(tmp_path, name):
    r = inspect_checkpoint(write_layout(name, BIG, canonical_state_dict(BIG), tmp_path / name))
    assert r.format == "eagle3.1" and r.flags.fc_norm and r.flags.norm_output
    assert r.sizes.model_dump() == {
        "hidden_size": 32, "target_hidden_size": 48, "num_aux": 3, "vocab_size": 100, "draft_vocab_size": 40,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_layers": 2,
        "mla": None,
    }
    if not name.startswith("safeailab"):  # undecided ids are reported as vLLM reads them (literally)
        undecided = AUX_DECIDED_BY[name] == "undecided"
        literal = [1, 4, 8] if AUX_CONVENTION[name] == "output-of-layer" else [2, 5, 9]
        assert r.aux_layer_ids == (literal if undecided else [2, 5, 9])
        assert r.aux_layer_ids_convention == ("undecided" if undecided else AUX_DECIDED_CONVENTION[name])


def test_parameter_count_and_dtype(tmp_path):
    sd = toy.drafter_state_dict("oracle")
    r = inspect_checkpoint(_toy(tmp_path, "specforge", sd))
    # specforge adds d2t [64] + t2d [64]
    assert r.num_parameters == sum(t.numel() for t in sd.values()) + 128
    assert r.dtype == "bfloat16"
    w4 = inspect_checkpoint(_toy(tmp_path, "quantized-w4a16", sd))
    assert w4.num_parameters == sum(t.numel() for t in sd.values())  # packed weights counted unpacked
    assert w4.dtype.startswith("mixed")


# ----- findings -------------------------------------------------------------------------------------------------------
def test_clean_checkpoint_with_target_has_no_errors(tmp_path, target):
    r = inspect_checkpoint(_toy(tmp_path), target=str(target))
    assert r.ok, r.findings
    assert r.target is not None and r.target.num_layers == toy.NUM_LAYERS


def test_aux_ids_out_of_range_for_target(tmp_path, target):
    r = inspect_checkpoint(_toy(tmp_path, aux_layer_ids=[1, 3, 9]), target=str(target))
    assert "aux_ids_out_of_range" in _codes(r, "error")
    r = inspect_checkpoint(_toy(tmp_path / "b", aux_layer_ids=[1, 3, 6]), target=str(target))
    assert "aux_id_last_layer" in _codes(r, "warning") and r.ok


def test_aux_ids_missing_and_vllm_default(tmp_path, target):
    p = _cfg_edit(_toy(tmp_path), eagle_aux_hidden_state_layer_ids=None, eagle_config=None)
    r = inspect_checkpoint(p)
    assert "aux_ids_missing" in _codes(r, "warning")
    r = inspect_checkpoint(p, target=str(target))  # T = 6 -> (2, 3, 3): two equal layers
    assert "aux_ids_default_invalid" in _codes(r, "error")


def test_aux_ids_count_and_nesting(tmp_path):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path), eagle_aux_hidden_state_layer_ids=[1, 3]))
    assert "aux_ids_count_mismatch" in _codes(r, "error")
    p = _cfg_edit(_toy(tmp_path / "n"), eagle_aux_hidden_state_layer_ids=None)
    r = inspect_checkpoint(p)
    assert "aux_ids_nested_only" in _codes(r, "warning") and r.aux_layer_ids == [1, 3, 5]


def test_fc_width_not_multiple_of_ht(tmp_path):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path), target_hidden_size=50))
    assert "fc_width_not_multiple" in _codes(r, "error")


def test_draft_vocab_larger_than_vocab(tmp_path):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path), vocab_size=32))
    assert "draft_vocab_exceeds_vocab" in _codes(r, "error")


def test_target_pairing_mismatches(tmp_path, target):
    c = json.loads((target / "config.json").read_text())
    c.update(hidden_size=128, vocab_size=70, rope_theta=500000.0, max_position_embeddings=8192,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 1024})
    write_json(target / "config.json", c)
    r = inspect_checkpoint(_toy(tmp_path), target=str(target))
    assert {"target_hidden_size_mismatch", "vocab_size_mismatch_target", "d2t_missing"} <= _codes(r, "error")
    assert {"rope_theta_mismatch", "rope_scaling_mismatch", "max_position_embeddings_low"} <= _codes(r, "warning")


def test_d2t_checks(tmp_path, target):
    cfg = toy.drafter_config(draft_vocab_size=32)
    sd = canonical_state_dict(cfg)
    base = write_layout("vllm-plain", cfg, sd, tmp_path / "ok")
    assert inspect_checkpoint(base, target=str(target)).ok
    bad = dict(sd, d2t=sd["d2t"] + 100)
    r = inspect_checkpoint(write_layout("vllm-plain", cfg, bad, tmp_path / "range"))
    assert "d2t_out_of_range" in _codes(r, "error")
    ids = torch.arange(32) + sd["d2t"]  # target ids stored instead of offsets
    r = inspect_checkpoint(write_layout("vllm-plain", cfg, dict(sd, d2t=ids), tmp_path / "ids"))
    assert {"d2t_out_of_range"} & _codes(r, "error") or "d2t_not_monotonic" in _codes(r, "error")
    nm = sd["d2t"].clone()
    nm[5] = nm[4] - 1
    r = inspect_checkpoint(write_layout("vllm-plain", cfg, dict(sd, d2t=nm), tmp_path / "nm"))
    assert "d2t_not_monotonic" in _codes(r, "error")
    nod2t = {k: v for k, v in sd.items() if k != "d2t"}
    from eagle_migrate.formats.output import save_safetensors

    p = write_layout("vllm-plain", cfg, sd, tmp_path / "nod2t")
    save_safetensors(nod2t, p / "model.safetensors")
    assert "d2t_missing" in _codes(inspect_checkpoint(p), "error")


def test_d2t_with_full_vocab_is_an_error(tmp_path):
    r = inspect_checkpoint(_toy(tmp_path, "safeailab-eagle3"))  # SafeAILab writes an all-zero d2t
    assert "d2t_with_full_vocab" in _codes(r, "error")


def test_no_lm_head(tmp_path):
    sd = {k: v for k, v in toy.drafter_state_dict("oracle").items() if k != "lm_head.weight"}
    r = inspect_checkpoint(_toy(tmp_path, sd=sd))
    assert "no_lm_head" in _codes(r, "warning")
    cfg = toy.drafter_config(draft_vocab_size=32)
    sd = {k: v for k, v in canonical_state_dict(cfg).items() if k != "lm_head.weight"}
    r = inspect_checkpoint(write_layout("vllm-plain", cfg, sd, tmp_path / "red"))
    assert "no_lm_head" in _codes(r, "error")


def test_hidden_size_and_layers_contradicting_the_weights(tmp_path):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path), hidden_size=128, num_hidden_layers=40))
    assert {"hidden_size_mismatch", "num_hidden_layers_mismatch"} <= _codes(r, "error")
    assert r.sizes.hidden_size == 64 and r.sizes.num_layers == 1  # the weights win


def test_max_position_embeddings_below_target(tmp_path, target):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path), max_position_embeddings=512), target=str(target))
    assert "max_position_embeddings_low" in _codes(r, "warning")


def test_fc_norm_flag_and_weights(tmp_path):
    r = inspect_checkpoint(_cfg_edit(_toy(tmp_path / "a"), fc_norm=True))
    assert "fc_norm_weights_missing" in _codes(r, "error")
    cfg = toy.drafter_config(fc_norm=True)
    sd = canonical_state_dict(cfg)
    p = _cfg_edit(write_layout("vllm-plain", cfg, sd, tmp_path / "b"), fc_norm=None)
    assert "fc_norm_flag_missing" in _codes(inspect_checkpoint(p), "error")
    p = _cfg_edit(write_layout("vllm-plain", cfg, dict(sd, **{f"fc_norm.{k}.weight": torch.ones(64) for k in range(3)}), tmp_path / "c"))
    assert "fc_norm_all_ones" in _codes(inspect_checkpoint(p), "info")


def test_norm_output_flags(tmp_path):
    r = inspect_checkpoint(_toy(tmp_path / "a", norm_output=True))
    assert "norm_output_unverifiable" in _codes(r, "info")
    p = _toy(tmp_path / "b")
    c = json.loads((p / "config.json").read_text())
    c["eagle_config"]["norm_output"] = True
    write_json(p / "config.json", c)
    r = inspect_checkpoint(p)
    assert "flag_nested_only" in _codes(r, "error") and not r.flags.norm_output
    r = inspect_checkpoint(_toy(tmp_path / "c", "specforge", norm_output=True))
    assert "specforge_norm_output_semantics" in _codes(r, "warning")


def test_norm_before_fc(tmp_path):
    cfg = toy.drafter_config(norm_before_fc=True)
    sd = canonical_state_dict(cfg)
    p = _cfg_edit(write_layout("vllm-plain", cfg, sd, tmp_path / "a"), norm_before_fc=None)
    assert "norm_before_fc_flag_missing" in _codes(inspect_checkpoint(p), "error")
    c = json.loads((p / "config.json").read_text())
    c["eagle_config"]["norm_before_fc"] = True
    write_json(p / "config.json", c)
    r = inspect_checkpoint(p)
    assert "norm_before_fc_nested" in _codes(r, "warning") and r.flags.norm_before_fc and r.ok
    p = _cfg_edit(_toy(tmp_path / "b"), norm_before_fc=True)
    assert "input_norm_missing" in _codes(inspect_checkpoint(p), "error")


def test_model_prefix_and_embed_missing(tmp_path):
    assert "model_prefix" in _codes(inspect_checkpoint(_toy(tmp_path / "a", "model-prefix")), "error")
    cfg = BIG
    sd = {k: v for k, v in canonical_state_dict(cfg).items() if k != "embed_tokens.weight"}
    r = inspect_checkpoint(write_layout("vllm-plain", cfg, sd, tmp_path / "b"))
    assert "embed_tokens_missing" in _codes(r, "error")


def test_nan_in_norm_always_found_nan_in_big_tensor_only_with_deep(tmp_path):
    sd = toy.drafter_state_dict("oracle")
    sd["norm.weight"] = sd["norm.weight"].clone()
    sd["norm.weight"][3] = float("nan")
    r = inspect_checkpoint(_toy(tmp_path / "a", sd=sd))
    assert "nonfinite_weights" in _codes(r, "error")
    sd = toy.drafter_state_dict("oracle")
    big = torch.zeros(64, 3 * 64 * 400)  # > SMALL_NUMEL elements
    big[0, 5] = float("inf")
    cfg = toy.drafter_config()
    p = write_layout("vllm-plain", cfg, sd, tmp_path / "b")
    from eagle_migrate.formats.output import save_safetensors

    cfg2 = cfg.model_copy(update={"target_hidden_size": 64 * 400})
    save_safetensors(dict(sd, **{"fc.weight": big}), p / "model.safetensors")
    _cfg_edit(p, target_hidden_size=cfg2.target_hidden_size)
    assert "nonfinite_weights" not in _codes(inspect_checkpoint(p))
    r = inspect_checkpoint(p, deep=True)
    assert "nonfinite_weights" in _codes(r, "error") and r.deep


def test_mla_is_reported_not_misread(tmp_path):
    from ..layouts import MLA

    r = inspect_checkpoint(_toy(tmp_path, "mla"))
    assert r.architecture == "mla" and r.sizes.mla == MLA and r.sizes.num_attention_heads == 2
    assert "mla_cpu_head_size" in _codes(r, "info")  # kv_lora 16 + rope 8 != 576


def test_eagle2_is_reported(tmp_path):
    r = inspect_checkpoint(_toy(tmp_path, "safeailab-eagle2"))
    assert r.format == "eagle2" and r.producer == "safeailab" and "eagle2_generation" in _codes(r)


def test_speculators_traps(tmp_path):
    p = _toy(tmp_path, "speculators", fc_norm=False, norm_output=True)
    c = json.loads((p / "config.json").read_text())
    c.pop("norm_before_residual")
    c["transformer_layer_config"]["norm_output"] = c.pop("norm_output")
    write_json(p / "config.json", c)
    r = inspect_checkpoint(p)
    assert "flag_nested_only" in _codes(r, "error") and "norm_before_residual_implicit" in _codes(r, "warning")
    assert r.flags.norm_before_residual is True  # what vLLM assumes


# ----- cheapness ------------------------------------------------------------------------------------------------------
def test_inspect_reads_headers_and_small_tensors_only(tmp_path, monkeypatch):
    """The big tensors are never read: inspect costs the same for any checkpoint size."""
    from eagle_migrate.formats.io import TensorStore

    cfg = toy.drafter_config(draft_vocab_size=32)
    sd = canonical_state_dict(cfg)
    sd["lm_head.weight"] = torch.zeros(32, 64)
    p = write_layout("specforge", cfg, sd, tmp_path / "a")
    read: list[str] = []

    def spying(orig):
        def spy(self, name):
            read.append(name)
            return orig(self, name)
        return spy

    for method in ("get", "mapped", "array"):  # every way to read tensor values (array: numpy, no torch)
        monkeypatch.setattr(TensorStore, method, spying(getattr(TensorStore, method)))
    monkeypatch.setattr("eagle_migrate.inspection.SMALL_NUMEL", 1000)
    inspect_checkpoint(p)
    big = {"midlayer.self_attn.q_proj.weight", "fc.weight", "midlayer.mlp.gate_proj.weight", "lm_head.weight"}
    assert read and not (set(read) & big), read
    assert {"d2t", "t2d"} <= set(read)


# ----- CLI ------------------------------------------------------------------------------------------------------------
runner = CliRunner()


def test_cli_help():
    from eagle_migrate.cli import app

    r = runner.invoke(app, ["inspect", "--help"])
    assert r.exit_code == 0
    for opt in ("--target", "--deep", "--json", "Example"):
        assert opt in r.output


def test_cli_json_is_one_document_and_exit_codes(tmp_path, target):
    from eagle_migrate.cli import app

    good = _toy(tmp_path / "g")
    r = runner.invoke(app, ["inspect", str(good), "--target", str(target), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "eagle3" and doc["producer"] == "vllm" and doc["sizes"]["hidden_size"] == 64
    assert doc["target"]["num_layers"] == 6 and isinstance(doc["findings"], list)
    InspectReport.model_validate(doc)
    bad = _toy(tmp_path / "b", "model-prefix")
    r = runner.invoke(app, ["inspect", str(bad), "--json"])
    assert r.exit_code == 1
    assert any(f["code"] == "model_prefix" and f["severity"] == "error" for f in json.loads(r.stdout)["findings"])


def test_cli_table(tmp_path):
    from eagle_migrate.cli import app

    r = runner.invoke(app, ["inspect", str(_toy(tmp_path, "specforge"))], env={"COLUMNS": "200"})
    assert r.exit_code == 1  # SpecForge's identity d2t
    assert "specforge" in r.output and "d2t_with_full_vocab" in r.output and "[1, 3, 5]" in r.output


def test_cli_in_a_process(tmp_path, target):
    p = _toy(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "inspect", str(p), "--target", str(target), "--json", "--deep"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deep"] is True


def test_cli_bad_target_exits_2(tmp_path):
    p = _toy(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "inspect", str(p), "--target", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr


def test_every_finding_code_is_documented():
    import re

    root = Path(__file__).resolve().parents[2]
    src = "".join((root / "eagle_migrate" / p).read_text() for p in
                  ["inspection.py", *[f"formats/{f.name}" for f in (root / "eagle_migrate" / "formats").glob("*.py")]])
    codes = set(re.findall(r'finding\(\s*"(?:error|warning|info)",\s*"([a-z0-9_]+)"', src))
    doc = (root / "docs" / "formats.md").read_text()
    assert len(codes) > 40
    missing = sorted(c for c in codes if f"`{c}`" not in doc)
    assert not missing, missing
