"""Layering: the library never imports the CLI (typer), and reading a checkpoint's headers never imports torch.

Each check runs in a fresh interpreter, so what it sees in ``sys.modules`` is exactly what those imports pulled in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("eagle_migrate.convert", "eagle_migrate.migrate", "eagle_migrate.quantize", "eagle_migrate.validate.api",
           "eagle_migrate.calibrate", "eagle_migrate.publish", "eagle_migrate.inspection", "eagle_migrate.formats",
           "eagle_migrate.aux_ids", "eagle_migrate.aux_evidence", "eagle_migrate.devices", "eagle_migrate.pipeline", "eagle_migrate.demo",
           "eagle_migrate.corpora", "eagle_migrate.assets", "eagle_migrate.train", "eagle_migrate.stats",
           "eagle_migrate.judge", "eagle_migrate.features", "eagle_migrate.fingerprints", "eagle_migrate.calibration_data", "eagle_migrate.target", "eagle_migrate.choices")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_library_does_not_import_the_cli():
    """The stage modules (and migrate's option check, which once read the CLI's Enums) import neither typer nor
    eagle_migrate.cli."""
    code = f"""
import importlib, sys
from pathlib import Path
for m in {LIBRARY!r}:
    importlib.import_module(m)
from eagle_migrate.errors import InputError
from eagle_migrate.migrate import MigrateOptions, check_options
for bad in (dict(train="norm"), dict(quantize="fp9"), dict(output_format="gguf"), dict(engine="sglang")):
    try:
        check_options(Path(sys.argv[1]), "t", Path(sys.argv[1]) / "out", MigrateOptions(**bad))
        raise SystemExit(f"accepted {{bad}}")
    except InputError as e:
        assert list(bad.values())[0] in e.message, e.message
print(sorted(m for m in sys.modules if m == "typer" or m.startswith(("typer.", "eagle_migrate.cli", "click"))))
"""
    r = _python(code, str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout


def _imported_by_cli(*argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    code = """
import json, sys
from eagle_migrate.cli import main
rc = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
heavy = ("torch", "transformers", "numpy", "vllm")
sys.stderr.write("\\nIMPORTED " + json.dumps({"rc": rc, "heavy": [m for m in heavy if m in sys.modules]}) + "\\n")
"""
    r = _python(code, *argv)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("IMPORTED ")]
    assert line, r.stderr[-3000:]
    return r, json.loads(line[-1].removeprefix("IMPORTED "))


@pytest.mark.parametrize("argv", [("--help",), ("inspect", "--help"), ("convert", "--help"), ("migrate", "--help")])
def test_help_does_not_import_torch(argv):
    r, seen = _imported_by_cli(*argv)
    assert seen["rc"] == 0 and "Usage" in r.stdout
    assert "torch" not in seen["heavy"] and "transformers" not in seen["heavy"], seen


# ----- import cycles --------------------------------------------------------------------------------------------
def _import_graph(lazy: bool) -> dict[str, set[str]]:
    """eagle_migrate module -> the eagle_migrate modules it imports: at module level, or (``lazy``) anywhere,
    function bodies and TYPE_CHECKING blocks included."""
    import ast

    pkg = ROOT / "eagle_migrate"
    mods: dict[str, Path] = {}
    for p in pkg.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        nodes = ast.walk(tree) if lazy else iter(tree.body)
        base = name.split(".") if p.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    up = base[: len(base) - (node.level - 1)]
                    mod = ".".join(up + ([node.module] if node.module else []))
                elif (node.module or "").startswith("eagle_migrate"):
                    mod = node.module
                else:
                    continue
                for a in node.names:
                    deps.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("eagle_migrate"))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_level_import_cycle():
    assert _cycles(_import_graph(lazy=False)) == []


@pytest.mark.parametrize("modules", [
    "eagle_migrate.formats.",  # was common -> vllm -> write -> speculators -> common (write_vllm lived in vllm.py)
    ("eagle_migrate.corpora", "eagle_migrate.assets"),  # was data <-> assets through data._iter_json_list
])
def test_no_import_cycle_even_through_function_level_imports(modules):
    graph = _import_graph(lazy=True)
    keep = {m for m in graph if (m.startswith(modules) if isinstance(modules, str) else m in modules)}
    assert len(keep) >= 2
    assert _cycles({m: graph[m] & keep for m in keep}) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ----- inspect reads headers (and small tensors through numpy): no torch --------------------------------------------
def test_inspect_json_imports_neither_torch_nor_transformers(tmp_path):
    """`inspect --json` of a drafter (safetensors) reads headers and small tensors without importing torch; the
    report is the same as the library's (which the other inspect tests check)."""
    from eagle_migrate import toy

    d = toy.write_drafter(tmp_path / "d", "random")
    r, seen = _imported_by_cli("inspect", str(d), "--json")
    assert seen["rc"] == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["format"] == "eagle3" and doc["sizes"]["hidden_size"] == toy.H and doc["num_tensors"] > 0
    assert any(f["code"] == "nonfinite_check_partial" for f in doc["findings"])  # small tensors were read
    assert "torch" not in seen["heavy"] and "transformers" not in seen["heavy"], seen


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "bool"])
def test_store_array_is_exactly_the_tensor(tmp_path, dtype):
    """TensorStore.array (numpy, no torch) gives exactly torch's values, NaN and Inf included, for every dtype
    inspect reads (bfloat16 and float8 widened to float32)."""
    import numpy as np
    import torch

    from eagle_migrate.formats.io import TensorStore
    from eagle_migrate.formats.output import save_safetensors

    dt = getattr(torch, dtype)
    if dtype == "bool":
        t = torch.tensor([True, False, True])
    elif dtype == "int64":
        t = torch.tensor([[0, -5], [7, 2**40]])
    else:
        t = torch.tensor([0.0, 1.0, -1.5, 0.0625, 3e-3, 200.0, float("nan")]).to(dt)
        if dtype != "float8_e4m3fn":  # E4M3 (fn) has no Inf
            t = torch.cat([t, torch.tensor([float("inf"), float("-inf")]).to(dt)])
        t = t.reshape(1, -1)
    f = tmp_path / "m.safetensors"
    save_safetensors({"x": t}, f)
    a = TensorStore(tmp_path, [f]).array("x")
    want = (t.float() if t.is_floating_point() else t).numpy()
    assert a.shape == want.shape and a.dtype == want.dtype
    np.testing.assert_array_equal(a, want)  # NaN equals NaN here
