"""Issue 28 (smaller items): messages that read right: "an 8-layer target", a note when a family-specific drafter
(Qwen3, MLA) is paired with a target of another family."""

from __future__ import annotations

import pytest

from eagle_migrate.errors import a_an


@pytest.mark.parametrize("thing,want", [
    (8, "an 8"), ("8-layer", "an 8-layer"), (11, "an 11"), (18, "an 18"), (80, "an 80"), (800, "an 800"),
    (8192, "an 8192"), (11000, "an 11000"), (18000, "an 18000"),
    (6, "a 6"), (12, "a 12"), (110, "a 110"), (1800, "a 1800"), (1024, "a 1024"), (0, "a 0"),
    ("eagle2", "an eagle2"), ("EAGLE-3", "an EAGLE-3"), ("int", "an int"), ("list", "a list"), ("unique", "a unique"),
])
def test_a_an(thing, want):
    assert a_an(thing) == want


def test_aux_id_reason_on_an_8_layer_target():
    """The message the issue saw ("a 8-layer target"), from the aux-id decision that writes it."""
    from eagle_migrate.formats.aux_ids import from_stored, resolve

    got = resolve(from_stored([3, 5, 8], "top-level"), 3, 8)
    assert got.convention == "vllm" and "impossible on an 8-layer target" in got.reason, got.reason


def test_a_qwen3_drafter_on_a_llama_target_is_noted(tmp_path, toy_target):
    from eagle_migrate import toy
    from eagle_migrate.pairing import target_family_note
    from eagle_migrate.inspection import inspect_checkpoint

    qwen3 = toy.write_drafter(tmp_path / "qwen3", "oracle", family="qwen3")
    r = inspect_checkpoint(qwen3, target=str(toy_target), aux_ids_convention="vllm")
    notes = [f for f in r.findings if f.code == "drafter_family_differs"]
    assert len(notes) == 1 and notes[0].severity == "warning" and "'llama'" in notes[0].message, r.findings
    llama = inspect_checkpoint(toy.write_drafter(tmp_path / "llama", "oracle"), target=str(toy_target), aux_ids_convention="vllm")
    assert "drafter_family_differs" not in {f.code for f in llama.findings}
    # the generic Llama layer is trained for every family (no note); same family, no note
    assert target_family_note("llama", "qwen3") is None and target_family_note("qwen3", "qwen3_moe") is None
    assert target_family_note("mla", "deepseek_v3") is None and target_family_note("mla", "llama") is not None
