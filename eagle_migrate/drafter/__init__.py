"""The drafter: its config and the torch module that runs it exactly as vLLM does.

``EagleDrafter`` & co. are imported on first use (PEP 562): reading a config (``inspect``) never imports torch.
"""

from typing import TYPE_CHECKING

from .config import DrafterConfig

if TYPE_CHECKING:
    from .model import EagleDrafter, KVCache, StepOutput

__all__ = ["DrafterConfig", "EagleDrafter", "KVCache", "StepOutput"]


def __getattr__(name: str):
    if name in ("EagleDrafter", "KVCache", "StepOutput"):
        from . import model  # lazy: torch stays out of inspect (EagleDrafter & co. on first use)

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
