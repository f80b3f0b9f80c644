"""``speculators train`` (speculators' own training CLI, unchanged) on a machine without an accelerator.

speculators 0.9.0's trainer assumes an accelerator: it takes ``torch.accelerator.current_accelerator()`` (falling
back to "cuda" when there is none), moves the model and every batch to ``get_local_rank()`` (the device index 0),
and pins the data loader's memory (which needs an accelerator). Its step timer also synchronises the accelerator, and its resume maps the saved
weights and optimizer state onto "cpu:0", which safetensors and torch.load refuse. This wrapper answers "cpu" (device
index 0) to the first two, resumes onto "cpu", makes the synchronisation and the final cache emptying
(``torch.cpu`` has no ``empty_cache``: the run crashed after saving its last checkpoint) no-ops and turns pinning off, then runs the CLI with the arguments given; nothing else changes, e.g.

    python benchmarks/speculators_train_cpu.py --speculator-type eagle3 --verifier-name-or-path DIR ...
"""

import sys

import torch

torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
torch.accelerator.current_device_index = lambda: 0
torch.accelerator.is_available = lambda: False  # no accelerator memory statistics
torch.accelerator.synchronize = lambda *a, **k: None  # its step timer synchronises; a CPU has nothing to wait for
if not hasattr(torch.cpu, "empty_cache"):  # its shutdown empties the accelerator cache: torch.cpu has none
    torch.cpu.empty_cache = lambda: None

import speculators.train.checkpointer as _checkpointer  # noqa: E402
import speculators.train.dataloader as _dataloader  # noqa: E402
import speculators.train.trainer as _trainer  # noqa: E402
from speculators.__main__ import app  # noqa: E402

_trainer.get_local_rank = lambda: "cpu"
_checkpointer.get_current_device = lambda: "cpu"  # its resume maps saved weights and optimizer state there
_DataLoader = _dataloader.DataLoader
_dataloader.DataLoader = lambda *a, **k: _DataLoader(*a, **{**k, "pin_memory": False})

if __name__ == "__main__":
    sys.argv = ["speculators", "train", *sys.argv[1:]]
    sys.exit(app())
