"""Acceptance-length validation, the stage: suites, gates, reports and the per-request triage, measured by the
engines of ``eagle_migrate/engines/`` (registered by name: vLLM in a subprocess worker, the pure-torch reference
engine, a running vLLM server).

``run_validation(checkpoint, target, ValidateOptions) -> ValidationReport`` is the one entry point
(eagle_migrate/validate/api.py; ``validate`` and ``validate_server`` are its keyword forms); it is imported lazily, so
``import eagle_migrate.validate`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ValidateOptions", "ValidationReport", "run_validation", "validate", "validate_server"]


def __getattr__(name: str) -> Any:
    if name in ("validate", "validate_server", "run_validation"):
        from . import api  # lazy: api imports torch (through the target); a vLLM-only Python imports vllm_worker

        return getattr(api, name)
    if name == "ValidationReport":
        from .report import ValidationReport  # lazy: torch (the report's drift diagnostics)

        return ValidationReport
    if name == "ValidateOptions":
        from ..engines.options import ValidateOptions  # lazy: pydantic, kept out of a light import

        return ValidateOptions
    raise AttributeError(name)
