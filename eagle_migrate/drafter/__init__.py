"""The drafter: its config and the torch module that runs it exactly as vLLM does."""

from .config import DrafterConfig
from .model import EagleDrafter, KVCache, StepOutput

__all__ = ["DrafterConfig", "EagleDrafter", "KVCache", "StepOutput"]
