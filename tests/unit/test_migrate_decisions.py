"""migrate's convert stage decides what convert decides with the same flags (issue 48): fine-tune or judge, what
trains, on which data, for how many steps, and why, for every kind of source, on a CPU and on a (simulated) CUDA
device. migrate once spread its composed options back into keywords and passed the *resolved* ``train`` (``norms``)
as if typed: convert then saw "--train given", fine-tuned where it judges, and never took the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_migrate.convert import convert
from eagle_migrate.migrate import MigrateOptions, migrate

from .test_convert import KW, eagle2_oracle, toy_cfg, write_src

KINDS = ("plain", "speculators-style", "eagle2", "eagle3.1")
FLAGS = ({}, {"calibrate": True}, {"steps": 0}, {"train": "all"}, {"calibrate": False})


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[str, dict[str, Path]]:
    from eagle_migrate import toy

    from .test_convert import LAYERS

    d = tmp_path_factory.mktemp("decisions")
    target = str(toy.write_target(d / "target", layers=LAYERS))
    plain = write_src(d / "plain", cfg=toy_cfg(norm_before_residual=False))
    out = {"plain": plain, "speculators-style": write_src(d / "spec", cfg=toy_cfg(norm_before_residual=True)),
           "eagle2": eagle2_oracle(d / "e2")}
    convert(plain, target, d / "e31", **KW)  # an EAGLE-3.1 drafter: convert's own output
    out["eagle3.1"] = d / "e31"
    return target, out


@pytest.fixture
def recorded(monkeypatch, calibration_recorder):
    """The calibration replaced by a recorder (what it was asked to do is under test, not the fine-tune), and a
    switch that makes convert's decision see a CUDA device."""
    import eagle_migrate.convert.base as base

    seen = calibration_recorder
    real = base.choose

    def on(device: str) -> None:
        if device == "cuda":
            monkeypatch.setattr(base, "choose", lambda kind, _dev, *a: real(kind, "cuda:0", *a))

    return seen, on


def _asked(seen: list, before: int) -> dict | None:
    """What the calibration was asked (None: it was not called)."""
    if len(seen) == before:
        return None
    s = seen[-1]
    return {"train": s.train, "mode": s.mode, "steps": s.steps, "data": None if s.data is None else str(s.data),
            "lr": s.lr, "max_minutes": s.max_minutes}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", KINDS)
def test_migrate_and_convert_make_the_same_decisions(sources, recorded, tmp_path, kind, device):
    target, srcs = sources
    seen, on = recorded
    on(device)
    for i, flags in enumerate(FLAGS):
        n = len(seen)
        res = convert(srcs[kind], target, tmp_path / f"c{i}", num_sequences=8, command="test", **flags)
        by_convert = (res.decision, res.defaults, res.calibration.status, _asked(seen, n))
        n = len(seen)
        run = migrate(srcs[kind], target, tmp_path / f"m{i}", MigrateOptions.of(num_sequences=8, **flags))
        assert run.ok, run
        doc = json.loads((tmp_path / f"m{i}" / "convert" / "convert.json").read_text())
        by_migrate = (doc["decision"], doc["defaults"], doc["calibration"]["status"], _asked(seen, n))
        assert by_migrate == by_convert, f"{kind} on {device} with {flags or 'the defaults'}"
        # the manifest records the decision as convert's report says it
        manifest = json.loads((tmp_path / f"m{i}" / "migrate-manifest.json").read_text())
        outputs = manifest["stages"]["convert"]["outputs"]
        assert outputs["decision"] == res.decision and outputs["defaults"] == res.defaults
    assert len(seen) > 0


def test_the_decision_line_names_who_decided(sources, recorded, tmp_path):
    """The one line both reports show: the CPU default of an EAGLE-3 source is the judge alone, a GPU's the recipe's
    fine-tune, an EAGLE-2 source's the required fine-tune, and a given flag is named."""
    target, srcs = sources
    seen, on = recorded
    assert convert(srcs["plain"], target, tmp_path / "a", **KW | {"calibrate": None}).decision == "judged only (CPU default)"
    assert convert(srcs["eagle2"], target, tmp_path / "b", **KW | {"calibrate": None}).decision.startswith("fine-tuned (EAGLE-2")
    assert convert(srcs["plain"], target, tmp_path / "c", **KW | {"calibrate": None}, train="all").decision == "fine-tuned (--train given)"
    assert convert(srcs["plain"], target, tmp_path / "d", **KW).decision == "not calibrated (--no-calibrate)"
    on("cuda")
    assert convert(srcs["plain"], target, tmp_path / "e", **KW | {"calibrate": None}).decision == \
        "fine-tuned (GPU default; recipe --train norms+fc)"
