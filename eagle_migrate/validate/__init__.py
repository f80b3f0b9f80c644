"""Acceptance-length validation: vLLM engine (subprocess worker), reference engine (pure torch), reports.

``validate(checkpoint, target, ...) -> ValidationReport`` is the one entry point (eagle_migrate/validate/api.py);
it is imported lazily so ``import eagle_migrate.validate.vllm_worker`` stays light in a vLLM-only Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["validate", "ValidationReport"]


def __getattr__(name: str) -> Any:
    if name == "validate":
        from .api import validate

        return validate
    if name == "ValidationReport":
        from .report import ValidationReport

        return ValidationReport
    raise AttributeError(name)
