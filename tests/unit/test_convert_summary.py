"""convert's summary after the change: the source's findings that the output no longer has are listed as fixed
(not repeated as warnings), each line has one label, and no hint asks for a flag that was passed."""

from __future__ import annotations

import io

import torch

from rich.console import Console

from eagle_migrate import toy
from eagle_migrate.convert import convert
from eagle_migrate.formats import read_checkpoint

from ..layouts import write_layout
from .test_convert import LAYERS, toy_cfg, toy_layout_sd


def test_fixed_findings_are_listed_as_fixed_with_one_label(tmp_path, monkeypatch):
    toy.write_target(tmp_path / "target", layers=LAYERS)
    # SpecForge's layout: d2t with Vd = V (vLLM >= 0.30 refuses it) and aux ids that read two ways
    src = write_layout("specforge", toy_cfg(), toy_layout_sd(), tmp_path / "sf")
    codes = {f.code for f in read_checkpoint(src).findings}
    assert {"d2t_with_full_vocab", "aux_ids_convention_ambiguous"} <= codes
    res = convert(src, str(tmp_path / "target"), tmp_path / "out", aux_ids_convention="output-of-layer", num_sequences=8,
                  command="test", calibrate=False)
    assert any(f.startswith("d2t_with_full_vocab:") for f in res.fixed)
    assert any(f.startswith("aux_ids_convention_ambiguous:") for f in res.fixed)
    text = " ".join(res.warnings)
    assert "d2t" not in text and "--aux-ids-convention" not in text and "--target" not in text
    assert "--target" not in " ".join(res.fixed) and "drop" not in " ".join(res.fixed)

    import eagle_migrate.cli.convert as cli_convert

    buf = io.StringIO()
    monkeypatch.setattr(cli_convert, "stdout", Console(file=buf, width=400))
    res.warnings = res.warnings + ["error: still broken", "a plain line"]
    cli_convert.render_result(res)
    lines = buf.getvalue().splitlines()
    row = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in lines if ln.count("│") >= 3 and ln.split("│")[1].strip()}
    assert "warning: " not in buf.getvalue() and "error: " not in buf.getvalue()  # the label is the line's only label
    assert row.get("error") == "still broken"
    assert any(ln.split("│")[1].strip() == "fixed" and "d2t_with_full_vocab" in ln for ln in lines if ln.count("│") >= 3)
    assert any(ln.split("│")[1].strip() == "warning" and "a plain line" in ln for ln in lines if ln.count("│") >= 3)


def test_the_ambiguity_hint_after_a_measurement_asks_only_for_the_convention(tmp_path, monkeypatch):
    """After measuring on a target (which could not decide), the ambiguity's hint no longer says "pass --target".
    The paired log-likelihood decides this toy, so the measurement's budget is cut to one sequence (too few for a
    clustered standard error: inconclusive)."""
    from eagle_migrate import aux_evidence
    from eagle_migrate.formats import aux_ids
    from eagle_migrate.target import LazyTarget

    sequential = aux_evidence.sequential
    monkeypatch.setattr(aux_evidence, "sequential", lambda *a, **kw: sequential(*a, **{**kw, "budget_sequences": 1}))

    toy.write_target(tmp_path / "target", layers=LAYERS)
    ck = read_checkpoint(write_layout("specforge", toy_cfg(), toy_layout_sd(), tmp_path / "sf"))
    plain = next(f.message for f in ck.findings if f.code == "aux_ids_convention_ambiguous")
    assert "pass --target" in plain
    b = aux_evidence.resolve_for_target(ck, LazyTarget(str(tmp_path / "target"), "cpu", torch.float32))
    assert not b.decided and b.measurement is not None and b.measurement.verdict == "inconclusive"
    (f,) = aux_ids.findings(b, ck.producer)
    assert f.code == "aux_ids_convention_ambiguous"
    assert "pass --target" not in f.message and "--aux-ids-convention" in f.message
