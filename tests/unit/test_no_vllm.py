"""``eagle-migrate demo`` in an environment without vLLM (issue 16.3): validate falls back to the reference engine,
which reads the fp8-dynamic drafter quantize wrote, and the demo says which engine it used and why (issue 28.1), and
its table shows the drift pair's point: the source loses AL at long context, the converted drafter holds it.

"No vLLM" is simulated the way Python sees a missing package: a ``sitecustomize`` on PYTHONPATH sets
``sys.modules["vllm"] = None``, so ``importlib.util.find_spec("vllm")`` (what validate's engine resolution asks) is
None and ``import vllm`` raises ImportError, in the CLI process and in every Python it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SHIM = 'import sys\nsys.modules["vllm"] = None\n'


def _env(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "no-vllm"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM)
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), repo] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("EAGLE_MIGRATE_VLLM_PYTHON", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_the_shim_hides_vllm(tmp_path):
    code = ("import importlib.util\nfrom eagle_migrate.engines.in_process import resolve_engine\n"
            "print(importlib.util.find_spec('vllm'), resolve_engine('auto', None))\n"
            "try:\n    import vllm\nexcept ImportError:\n    print('ImportError')\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["None", "reference", "ImportError"]


def test_demo_passes_without_vllm_and_names_the_engine(tmp_path):
    env = _env(tmp_path)
    cli = [sys.executable, "-m", "eagle_migrate"]
    r = subprocess.run(cli + ["demo", "--out", str(tmp_path / "demo"), "--json"], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["engine"] == "reference"
    assert "vLLM is not importable" in res["engine_note"]  # the demo says why it measured without vLLM (issue 28.1)
    rows = {row["suite"]: (row["source_al"], row["new_al"]) for row in res["rows"]}
    assert rows["chat"] == (4.0, 4.0)  # short context: both drafters at the ceiling k + 1
    longs = {s: v for s, v in rows.items() if s.startswith("long ")}
    assert len(longs) >= 2 and all(new == 4.0 for _, new in longs.values()), rows  # the EAGLE-3.1 conversion holds
    assert all(src <= 2.0 for src, _ in longs.values()), rows  # the EAGLE-3 source drifts at long context
    assert res["verdict"].startswith("the EAGLE-3 source loses acceptance length on long")
    q = json.loads((tmp_path / "demo" / "run" / "quantize" / "quantize.json").read_text())
    assert q["scheme"] == "fp8-dynamic"  # the validated drafter is the quantized one
    # the table says which engine measured (the re-run resumes: every stage is already done)
    r = subprocess.run(cli + ["demo", "--out", str(tmp_path / "demo")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "engine: reference: vLLM is not importable" in r.stdout
    assert "constructed toy pair, not a real model" in r.stdout and "ceiling k+1 = 4" in r.stdout
