"""docs/extending.md stays true: the one recipe page has its three sections ("Add a drafter family", run by
tests/unit/test_family_home.py; "Add an engine" and "Add a quantization scheme", run here), and their python blocks,
run in order, register a trivial engine and a trivial quantization scheme and use them through the code every
built-in goes through (run_validation's suites, gates and report; quantize_state_dict, quantization_config,
scheme_from_config, the dequantisation)."""

from __future__ import annotations

import re
from pathlib import Path

from eagle_migrate import toy

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
SECTIONS = {"Add a drafter family": 2, "Add an engine": 2, "Add a quantization scheme": 2}  # section -> code blocks


def _blocks(section: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_the_recipe_page_has_the_three_sections_and_only_tested_code():
    """One page, three recipes, in this order; every code block on it is in a section a test runs (these counts
    are the ones the section's test asserts)."""
    text = DOC.read_text(encoding="utf-8")
    assert re.findall(r"^## (.+)$", text, flags=re.M) == list(SECTIONS)
    assert {s: len(_blocks(s)) for s in SECTIONS} == SECTIONS
    assert len(re.findall(r"^```", text, flags=re.M)) == 2 * sum(SECTIONS.values())  # no other fenced block


def test_add_an_engine(tmp_path):
    from eagle_migrate.engines.registry import engine_names, unregister_engine

    blocks = _blocks("Add an engine")
    assert len(blocks) == 2
    ns = {"drafter": str(toy.write_drafter(tmp_path / "d", "random")), "target": str(toy.write_target(tmp_path / "t"))}
    try:
        for code in blocks:
            exec(compile(code, str(DOC), "exec"), ns)
        assert "perfect" in engine_names()
        assert ns["report"].settings == {"num_speculative_tokens": 3} and ns["report"].gates[0].passed
    finally:
        unregister_engine("perfect")
    assert "perfect" not in engine_names()


def test_add_a_quantization_scheme():
    from eagle_migrate.quant.registry import SCHEMES, unregister_scheme

    blocks = _blocks("Add a quantization scheme")
    assert len(blocks) == 2
    ns = {"drafter_config": toy.drafter_config(), "state_dict": toy.drafter_state_dict("random")}
    try:
        for code in blocks:
            exec(compile(code, str(DOC), "exec"), ns)
        assert "fp8-weight-only" in SCHEMES and len(ns["layers"]) == 7
    finally:
        unregister_scheme("fp8-weight-only")
    from eagle_migrate.quant import quantization_config, scheme_from_config

    assert scheme_from_config(quantization_config("fp8")) == "fp8"  # the built-ins read as before
