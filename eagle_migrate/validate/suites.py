"""The suites a validation runs, for every engine: the prompt sets (``eagle_migrate.corpora``) built with the
session's tokenizer and the target's config, and what the engines run, ``{job: {"prompts", "max_tokens"}}`` (a
grouped suite as one job per group, so each group has its own counters). Imports: errors, corpora."""

from __future__ import annotations

import os
from typing import Any

from .. import corpora
from ..errors import DataError

DEFAULT_SUITES = ("chat", "code", "long", "template-shift")
GROUPED_SUITES = ("long", "template-shift")  # measured per group (own counters) for the breakdown tables/plots


def build_suites(tokenizer: Any, info: Any, max_model_len: int, suites: list[str] | tuple[str, ...] | None,
                 prompts_file: str | os.PathLike | None, *, num_prompts: int | None, max_tokens: int | None,
                 seed: int) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """(the suites, their jobs): ``suites`` by name (default: :data:`DEFAULT_SUITES`; with ``prompts_file`` and no
    ``suites`` only the user's prompts), each built with ``tokenizer`` on a target with config ``info`` to fit
    ``max_model_len``. DataError (exit 2) for an unknown suite name."""
    names = list(suites) if suites else ([] if prompts_file else list(DEFAULT_SUITES))
    if prompts_file is not None:
        names.append("prompts")
    for n in names:
        if n not in (*corpora.SUITE_NAMES, "prompts"):
            raise DataError(f"unknown suite '{n}'", f"choose from {', '.join(corpora.SUITE_NAMES)} or pass --prompts FILE")
    built = [corpora.suite(n, tokenizer, info, num_prompts=num_prompts, max_tokens=max_tokens, seed=seed,
                           max_model_len=max_model_len, prompts_file=prompts_file) for n in names]
    jobs: dict[str, dict[str, Any]] = {}
    for s in built:
        if s.name in GROUPED_SUITES and s.groups:
            for g, ps in s.by_group().items():
                jobs[f"{s.name}/{g}"] = {"prompts": ps, "max_tokens": s.max_tokens}
        else:
            jobs[s.name] = {"prompts": s.prompts, "max_tokens": s.max_tokens}
    return built, jobs


def job_keys(name: str, jobs: dict[str, Any]) -> list[str]:
    """The jobs of suite ``name``: itself, or one per group."""
    return [x for x in jobs if x == name or x.startswith(name + "/")]
