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
           "eagle_migrate.calibrate", "eagle_migrate.publish", "eagle_migrate.inspect", "eagle_migrate.formats",
           "eagle_migrate.aux_ids", "eagle_migrate.devices", "eagle_migrate.pipeline", "eagle_migrate.demo",
           "eagle_migrate.data", "eagle_migrate.assets", "eagle_migrate.train", "eagle_migrate.stats")


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
