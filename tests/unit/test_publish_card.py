"""Issue 28 (items 6, 7): the card and the published provenance say what happened and nothing else.

The flag that allowed an unvalidated publish is the one that was passed; the target is named (its Hub id, or a local
folder's own name) and never by a machine path; the lineage of every stage survives quantization; no temporary
folder names; "passed" only when a gate exists; numbers rounded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_migrate.publish import publish
from eagle_migrate.publish.provenance import public

from .test_publish import write_eagle31, write_report

SOURCE_SHA = "ab" * 32


def convert_record(target: str, **over) -> dict:
    """provenance.json as convert writes it (convert.result.Provenance), with a machine path as its target."""
    rec = {"tool": "eagle-migrate", "version": "0.1.0", "command": "eagle-migrate convert /root/src --target /root/t",
           "source": "/root/models/specforge-eagle3", "source_sha256": SOURCE_SHA, "source_files": ["model.safetensors"],
           "source_format": "eagle3", "source_producer": "specforge", "target": target, "target_name": None,
           "target_hub_id": None, "norm_init": "mean-rms", "calibration": "calibrated",
           "calibration_verdict": "EAGLE-3.1 conversion is within noise of the source (paired difference +0.001 +/- 0.004 in AL, +0.0 %)",
           "step0_agreement": 0.9558465286236297, "started_at": "2026-01-01T00:00:00+00:00"}
    rec.update(over)
    return rec


def quantize_record(parent: dict | None, target: str, name: str | None = None, hub: str | None = None) -> dict:
    """provenance.json as quantize writes it inside migrate's temporary stage folder, with convert's record kept."""
    return {"tool": "eagle-migrate", "version": "0.1.0", "command": "quantize",
            "source": {"path": "/root/run/convert/model", "sha256": "cd" * 32, "format": "eagle3.1", "producer": "eagle-migrate"},
            "options": {"scheme": "fp8-dynamic", "target": target, "target_name": name, "target_hub_id": hub},
            "result": {"output": "run/.quantize.tmp-9847-827fc1fd/model", "scheme": "fp8-dynamic",
                       "scheme_description": "FP8 E4M3 weights, FP8 activations, dynamic per token",
                       "checkpoint_ratio": 1.927, "min_sqnr_db": 31.653,
                       "speculative_config": {"model": "run/.quantize.tmp-9847-827fc1fd/model"}},
            "parent": parent}


def published_text(out: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(out.rglob("*")) if p.suffix in (".md", ".json"))


# ----- the flag that was passed --------------------------------------------------------------------------------------
def test_the_card_names_the_flag_that_was_passed(toy_oracle, tmp_path):
    """migrate --no-validate publishes with force: the card says --no-validate, never --force (it was not passed)."""
    res = publish(toy_oracle, "o/n", dry_run=True, out_dir=tmp_path / "a", force=True, forced_by="--no-validate",
                  target="meta-llama/Llama-3.1-8B-Instruct")
    card = (tmp_path / "a" / "README.md").read_text()
    assert "`--no-validate`" in card and "never measured" in card and "--force" not in card
    assert res.validation.forced_by == "--no-validate" and not res.validation.measured
    prov = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert prov["publish"]["validation"]["forced_by"] == "--no-validate"
    assert prov["publish"]["lineage"][-1] == {"stage": "validate", "summary": "not run (`--no-validate`): the acceptance length was never measured"}
    publish(toy_oracle, "o/n", dry_run=True, out_dir=tmp_path / "b", force=True)
    card = (tmp_path / "b" / "README.md").read_text()
    assert "published with `--force`" in card and "--no-validate" not in card


# ----- the target, named -----------------------------------------------------------------------------------------------
def test_a_local_target_is_named_by_its_config_never_its_path(toy_oracle, toy_target, tmp_path):
    import shutil

    named = tmp_path / "machine" / "path" / "smollm2"
    shutil.copytree(toy_target, named)
    cfg = json.loads((named / "config.json").read_text())
    cfg["_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (named / "config.json").write_text(json.dumps(cfg))
    res = publish(toy_oracle, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "a",
                  target=str(named))
    assert res.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert res.vllm_serve.startswith("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct ")

    bare = tmp_path / "machine" / "path" / "my-target"  # no _name_or_path: the folder's own name, marked local
    shutil.copytree(toy_target, bare)
    res = publish(toy_oracle, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "b",
                  target=str(bare))
    card = (tmp_path / "b" / "README.md").read_text()
    assert res.base_model is None and res.target_name == "my-target"
    assert "`my-target` (a local model; Hub id not recorded)" in card and "base_model" not in card
    assert "vllm serve my-target --speculative-config" in card and 'model="my-target"' in card
    assert "TARGET_MODEL" not in card and "TARGET_MODEL" not in res.vllm_serve
    assert str(tmp_path) not in published_text(tmp_path / "b")
    gguf = tmp_path / "machine" / "SmolLM2-135M-Instruct-Q8_0.gguf"  # migrate's --target may be a GGUF file too
    gguf.write_bytes(b"GGUF")
    res = publish(toy_oracle, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, target=str(gguf))
    assert res.target_name == "SmolLM2-135M-Instruct-Q8_0" and str(tmp_path) not in res.vllm_serve


def test_the_target_convert_recorded_is_named_after_its_folder_is_gone(tmp_path):
    """provenance.json from convert (nested under quantize's record) names the target: the card uses that name even
    where the local folder no longer exists, and the recorded machine path never reaches the repo."""
    gone = "/root/models/Qwen3-8B"
    conv = convert_record(gone, target_name="Qwen3-8B")
    ck = write_eagle31(tmp_path / "ck", quantize_record(conv, gone))
    res = publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out")
    assert res.base_model is None and res.target_name == "Qwen3-8B"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "target (verifier) | `Qwen3-8B` (a local model" in card and "vllm serve Qwen3-8B " in card
    text = published_text(tmp_path / "out")
    assert "/root" not in text and "Qwen3-8B" in text

    # a relative target path recorded where it existed, read elsewhere: shaped like ORG/NAME, yet not a Hub id
    ck3 = write_eagle31(tmp_path / "ck3", quantize_record(convert_record("models/Qwen3-8B", target_name="Qwen3-8B"),
                                                          "models/Qwen3-8B", name="Qwen3-8B"))
    res = publish(ck3, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True)
    assert res.base_model is None and res.target_name == "Qwen3-8B"

    ck2 = write_eagle31(tmp_path / "ck2", quantize_record(convert_record(gone, target_hub_id="Qwen/Qwen3-8B",
                                                                         target_name="Qwen/Qwen3-8B"), gone))
    res = publish(ck2, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out2")
    assert res.base_model == "Qwen/Qwen3-8B" and "base_model: Qwen/Qwen3-8B" in (tmp_path / "out2" / "README.md").read_text()


# ----- the lineage -----------------------------------------------------------------------------------------------------
def test_the_lineage_of_every_stage_and_no_temporary_paths(tmp_path):
    ck = write_eagle31(tmp_path / "ck", quantize_record(convert_record("meta-llama/Llama-3.1-8B-Instruct"),
                                                        "meta-llama/Llama-3.1-8B-Instruct"))
    rep = write_report(tmp_path / "rep", report_dir="run/.validate.tmp-9848-0a1b2c3d/report")
    publish(ck, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    lineage = card.split("## Lineage", 1)[1].split("##", 1)[0]
    rows = [ln.split(" | ")[0].strip("| ") for ln in lineage.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert rows == ["source", "convert", "quantize", "validate"]
    assert f"EAGLE-3 drafter from specforge, weights sha256 {SOURCE_SHA[:12]}" in lineage
    assert "EAGLE-3 -> EAGLE-3.1" in lineage and "step-0 agreement with the source 0.956;" in lineage
    assert "calibration: calibrated; verdict: EAGLE-3.1 conversion is within noise" in lineage and "+/-" in lineage
    assert "fp8-dynamic" in lineage and "1.93x smaller" in lineage and "31.7 dB" in lineage
    assert "the gate passed" in lineage and "chat AL 4.000 (baseline 2.000)" in lineage
    text = published_text(tmp_path / "out")
    assert "0.9558465286236297" not in card and ".tmp-" not in text and "/root" not in text
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert prov["parent"]["source_producer"] == "specforge"  # the whole record travels
    assert [s["stage"] for s in prov["publish"]["lineage"]] == rows


# ----- "passed" only when a gate exists --------------------------------------------------------------------------------
def test_passed_only_when_a_gate_exists(toy_oracle, tmp_path):
    ungated = write_report(tmp_path / "r0", gates=[],
                           suites=[{"name": "chat", "new": {"acceptance_length": 3.1}, "baseline": {"acceptance_length": 3.1},
                                    "regression_pct": 0.0004, "passed": True}])
    res = publish(toy_oracle, "o/n", report_dir=ungated, dry_run=True, out_dir=tmp_path / "a")
    card = (tmp_path / "a" / "README.md").read_text()
    assert "measured only: no acceptance gate was set" in card and "passed" not in card.split("## Validation", 1)[1].split("##")[0]
    assert res.validation.measured and res.validation.passed is None and res.validation.gates == 0
    assert "| chat | 3.100 | 3.100 | 0.000 |" in card and "-0.000" not in card
    res = publish(toy_oracle, "o/n", report_dir=write_report(tmp_path / "r1"), dry_run=True, out_dir=tmp_path / "b")
    assert "; the gate passed." in (tmp_path / "b" / "README.md").read_text() and res.validation.passed is True


# ----- what may leave the machine, and numbers -------------------------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    ("paired +0.000 +/- 0.004 in AL", "paired +0.000 +/- 0.004 in AL"),
    ("run/.quantize.tmp-9847-827fc1fd/model", "<local>/model"),
    ("written to run/.validate.tmp-1-ab/report today", "written to <local>/report today"),
    ("x /root/a/b y", "x <local>/b y"),
    ("fp8/nvfp4", "fp8/nvfp4"),
])
def test_public(text, want):
    assert public(text) == want


def test_no_negative_zero():
    from eagle_migrate.publish.card import fixed, scalar_str
    from eagle_migrate.validate.report import fmt_value

    assert scalar_str(-0.0001) == "0.000" and fixed(-0.04, 1, sign=True) == "0.0" and fixed(0.25, 1, sign=True) == "+0.2"
    assert fmt_value(-0.04, 1) == "0.0" and fmt_value(-0.04, 1, sign=True) == "0.0" and fmt_value(-1.26, 1) == "-1.3"


# ----- AL ± SE and the paired ratio from validate's report.json --------------------------------------------------------
def _validate_report(folder: Path, *, ses: bool = True, paired: dict | None = None, baseline: bool = True) -> Path:
    """report.json as ``validate`` writes it (its own models and writer): two suites, each AL with its SE and, with a
    baseline, the paired ratio, and ``overall``; ``ses=False``: as validate wrote it before SEs (no ``*_se``, no
    ``paired``, no ``overall`` SEs)."""
    from eagle_migrate.engines.metrics import AcceptanceStats, PairedComparison
    from eagle_migrate.validate.report import Gate, Metrics, SuiteResult, ValidationReport, write_report as write

    def m(drafts: int, accepted: int, se: float) -> Metrics:
        out = Metrics.from_stats(AcceptanceStats(num_drafts=drafts, num_draft_tokens=3 * drafts, num_accepted_tokens=accepted,
                                                 accepted_per_position=[accepted // 2, accepted // 3, accepted - accepted // 2 - accepted // 3],
                                                 num_prompts=8, num_output_tokens=drafts + accepted), 1.0)
        out.acceptance_length_se = se if ses else None
        return out

    pairs = paired or {"chat": PairedComparison(ratio=1.0588, se=0.0204, requests=8, verdict="improved"),
                       "code": PairedComparison(ratio=0.9950, se=0.0100, requests=8, verdict="within noise")}
    suites = [SuiteResult(name=n, description=n, prompt_set={"name": n, "size": 8}, new=m(100, a, 0.05),
                          baseline=m(100, b, 0.04) if baseline else None,
                          regression_pct=round(100 * (b - a) / (100 + b), 2) if baseline else None,
                          paired=PairedComparison.model_validate(pairs[n]) if ses and baseline else None)
              for n, a, b in (("chat", 80, 70), ("code", 199, 200))]
    overall = {"new": 2.395, "new_se": 0.06, "baseline": 2.35, "baseline_se": 0.05,
               "paired": PairedComparison(ratio=1.0191, se=0.012, requests=16, verdict="within noise").model_dump()}
    if not ses:
        overall = {"new": 2.395, "baseline": 2.35}
    if not baseline:
        overall = {"new": 2.395, "new_se": 0.06} if ses else {"new": 2.395}
    rep = ValidationReport(tool="eagle-migrate", created="now", checkpoint="c", baseline="b" if baseline else None,
                           target="t", engine="vllm", engine_version="0.32.0",
                           settings={"num_speculative_tokens": 3, "temperature": 0.0}, suites=suites, overall=overall,
                           gates=[Gate(name="min_acceptance_length", threshold=1.5, suite="chat", value=1.8, passed=True)])
    write(rep, folder)
    return folder


def _validation_of(card: str) -> str:
    return card.split("## Validation", 1)[1].split("\n## ", 1)[0]


def test_card_shows_al_se_and_the_paired_ratio(toy_oracle, tmp_path):
    rep = _validate_report(tmp_path / "rep")
    publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    v = _validation_of(card)
    assert "| suite | AL | baseline AL | paired ratio (AL / baseline AL) | verdict |" in v
    assert "| chat | 1.800 ± 0.050 | 1.700 ± 0.040 | 1.059 ± 0.020 | improved |" in v
    assert "| code | 2.990 ± 0.050 | 3.000 ± 0.040 | 0.995 ± 0.010 | within noise |" in v
    assert "| all suites | 2.395 ± 0.060 | 2.350 ± 0.050 | 1.019 ± 0.012 | within noise |" in v
    assert "AL ± its standard error (the request as the unit); paired ratio = AL / baseline AL" in v
    assert "beyond 2 SE of 1.0" in v
    lineage = card.split("## Lineage", 1)[1].split("\n## ", 1)[0]
    assert "chat AL 1.800 ± 0.050 (baseline 1.700 ± 0.040; paired ratio 1.059 ± 0.020, improved)" in lineage


def test_card_without_a_baseline_shows_al_se_and_no_ratio(toy_oracle, tmp_path):
    rep = _validate_report(tmp_path / "rep", baseline=False)
    publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    v = _validation_of((tmp_path / "out" / "README.md").read_text())
    assert "| suite | AL | per-position rate | passed |" in v and "| chat | 1.800 ± 0.050 |" in v
    assert "| all suites | 2.395 ± 0.060 |" in v
    assert "AL ± its standard error (the request as the unit)." in v and "paired" not in v


def test_an_older_report_without_ses_still_renders_and_shows_no_se(toy_oracle, tmp_path):
    """report.json from before SEs: the ALs alone, no ± and no legend, never a made-up SE."""
    rep = _validate_report(tmp_path / "rep", ses=False)
    raw = json.loads((rep / "report.json").read_text())
    assert "acceptance_length_se" not in json.dumps(raw).replace('"acceptance_length_se": null', "")
    for s in raw["suites"]:  # as the older writer left them: no such keys at all
        for role in ("new", "baseline"):
            s[role].pop("acceptance_length_se")
            s[role].pop("per_position_rate_se")
        s.pop("paired")
    (rep / "report.json").write_text(json.dumps(raw))
    res = publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    v = _validation_of(card)
    assert "| suite | AL | baseline AL | regression % (> 0 = worse) | per-position rate | passed |" in v
    assert "| chat | 1.800 | 1.700 |" in v and "| all suites | 2.395 | 2.350 |" in v
    assert "±" not in card and "standard error" not in v and "paired" not in v and res.validation.passed is True


def test_counters_missing_say_why_in_the_card(toy_oracle, tmp_path):
    why = "not paired: the engine returned no per-request counters"
    pairs = {n: {"requests": 0, "note": why} for n in ("chat", "code")}
    rep = _validate_report(tmp_path / "rep", paired=pairs)
    raw = json.loads((rep / "report.json").read_text())
    for s in raw["suites"]:
        for role in ("new", "baseline"):
            s[role]["acceptance_length_se"] = None
    raw["overall"] = {"new": 2.395, "baseline": 2.35, "paired": {"requests": 0, "note": why}}
    (rep / "report.json").write_text(json.dumps(raw))
    publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    v = _validation_of((tmp_path / "out" / "README.md").read_text())
    assert f"| chat | 1.800 | 1.700 | n/a | {why} |" in v and f"| all suites | 2.395 | 2.350 | n/a | {why} |" in v
    assert "±" not in v and "standard error" not in v


def test_quantize_lineage_carries_the_gate_ses(tmp_path):
    rec = quantize_record(convert_record("meta-llama/Llama-3.1-8B-Instruct"), "meta-llama/Llama-3.1-8B-Instruct")
    rec["result"]["acceptance"] = {"engine": "vllm", "before": 4.0, "after": 3.5, "before_se": 0.031, "after_se": 0.03,
                                   "paired": {"ratio": 0.875, "se": 0.006, "requests": 16, "verdict": "worse"}}
    ck = write_eagle31(tmp_path / "ck", rec)
    publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out")
    lineage = (tmp_path / "out" / "README.md").read_text().split("## Lineage", 1)[1]
    assert "AL 4.000 ± 0.031 -> 3.500 ± 0.030 (vllm; paired ratio 0.875 ± 0.006, worse)" in lineage
    old = quantize_record(convert_record("meta-llama/Llama-3.1-8B-Instruct"), "meta-llama/Llama-3.1-8B-Instruct")
    old["result"]["acceptance"] = {"engine": "vllm", "before": 4.0, "after": 3.5}  # a record from before the SEs
    ck2 = write_eagle31(tmp_path / "ck2", old)
    publish(ck2, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out2")
    assert "AL 4.000 -> 3.500 (vllm)" in (tmp_path / "out2" / "README.md").read_text()
