"""Device and dtype choices, resolved once for the library and the CLI (torch is imported only when resolving)."""

from __future__ import annotations

from typing import Any, get_args

from .choices import Device, Dtype
from .errors import InputError

DEVICES: tuple[str, ...] = get_args(Device)
DTYPES: tuple[str, ...] = get_args(Dtype)


def _name(v: Any) -> Any:
    return getattr(v, "value", v)  # an Enum carries its string in .value


def cuda_available() -> bool:
    """Whether a CUDA device is visible (False where torch itself is missing or broken): the one CUDA test."""
    try:
        import torch  # lazy: torch stays out of --help and inspect (only resolving needs it)

        return torch.cuda.is_available()
    except Exception:
        return False


def resolve_device(device: Any = "auto") -> str:
    """``auto`` -> ``cuda`` when a CUDA device is visible, else ``cpu``; ``cuda`` without one is an InputError
    (exit 2) instead of a crash deep inside a stage. Accepts a string, a CLI choice, a ``torch.device`` or None."""
    d = _name(device)
    if d is None or d == "auto":
        return "cuda" if cuda_available() else "cpu"
    d = str(d)
    if d.startswith("cuda") and not cuda_available():
        raise InputError(f"--device {d} was asked for but no CUDA device is visible", "use --device auto or cpu")
    return d


def resolve_dtype(dtype: Any, device: str):
    """``auto`` -> bfloat16 on a GPU, float32 on a CPU; a ``torch.dtype`` is returned as it is."""
    import torch  # lazy: torch stays out of --help and inspect (only resolving needs it)

    if isinstance(dtype, torch.dtype):
        return dtype
    d = _name(dtype) or "auto"
    if d == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if d not in DTYPES:
        raise InputError(f"--dtype {d!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, d)
