"""Layering: the library never imports the CLI (typer), and reading a checkpoint's headers never imports torch.

Each check runs in a fresh interpreter, so what it sees in ``sys.modules`` is exactly what those imports pulled in.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("eagle_migrate.convert", "eagle_migrate.migrate", "eagle_migrate.quantize", "eagle_migrate.validate.api",
           "eagle_migrate.calibrate", "eagle_migrate.publish", "eagle_migrate.inspection", "eagle_migrate.formats",
           "eagle_migrate.formats.aux_ids", "eagle_migrate.aux_evidence", "eagle_migrate.devices", "eagle_migrate.pipeline", "eagle_migrate.demo",
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
for bad in (dict(train="norm"), dict(scheme="fp9"), dict(output_format="gguf"), dict(engine="sglang")):
    try:
        check_options(Path(sys.argv[1]), "t", Path(sys.argv[1]) / "out", MigrateOptions.of(**bad))
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


@pytest.mark.parametrize("argv", [("--help",), ("inspect", "--help"), ("convert", "--help"), ("migrate", "--help"),
                                  ("watch", "--help")])
def test_help_does_not_import_torch(argv):
    r, seen = _imported_by_cli(*argv)
    assert seen["rc"] == 0 and "Usage" in r.stdout
    assert "torch" not in seen["heavy"] and "transformers" not in seen["heavy"], seen


OPTIONS_MODULES = ("eagle_migrate.convert.options", "eagle_migrate.calibrate.settings", "eagle_migrate.quantize.options",
                   "eagle_migrate.engines.options", "eagle_migrate.publish.options", "eagle_migrate.watch.models",
                   "eagle_migrate.migrate")


def test_the_options_models_load_without_torch():
    """Every stage's options model imports without torch (its package re-exports the torch side on first use), and
    so do the commands' options_model() loaders; the package's names still resolve when asked for."""
    code = f"""
import sys
for m in {OPTIONS_MODULES!r}:
    __import__(m)
assert "torch" not in sys.modules, [m for m in sys.modules if m.startswith("eagle_migrate")]
from eagle_migrate.cli.options import COMMANDS
models = [spec.load() for spec in COMMANDS.values() if spec.model is not None]
assert "torch" not in sys.modules
from eagle_migrate.convert import ConvertResult, convert
from eagle_migrate.quantize import SCHEMES, quantize
print("torch" in sys.modules, len(models))
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "8"], r.stdout


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


# ----- the layer table of docs/architecture.md, checked against the imports the code makes ---------------------------
# Imports that break a layer rule (run upward, or close a cycle inside a layer), each with its reason. Keep it short:
# an entry whose import is gone fails test_allow_list_is_not_stale, so it is removed with the import.
ALLOWED: dict[tuple[str, str], str] = {}


def _layer_table() -> dict[str, int]:
    """The rows of docs/architecture.md's layer table: module name (relative to eagle_migrate; "" for the root
    package) -> layer number."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    body = text.split("<!-- layers: begin -->", 1)[1].split("<!-- layers: end -->", 1)[0]
    table: dict[str, int] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`([\w.]+)`", cells[2]):
            rel = "" if name == "eagle_migrate" else name
            assert rel not in table, f"{name} has two rows in the layer table"
            table[rel] = int(cells[0])
    assert table, "no layer table in docs/architecture.md"
    return table


def _short(module: str) -> str:
    return module.removeprefix("eagle_migrate").removeprefix(".")


def _layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Every module of the package -> its layer: the row with the longest name that is the module or a package
    above it."""
    table = _layer_table()
    out: dict[str, int] = {}
    for m in graph:
        rel = _short(m)
        rows = [r for r in table if r == rel or (r and rel.startswith(r + ".")) or r == ""]
        rows = [r for r in rows if r == rel or r != ""]  # the root row names the root package only
        assert rows, f"{m} is in no row of the layer table in docs/architecture.md"
        out[rel] = table[max(rows, key=len)]
    return out


def _broken_rules(graph: dict[str, set[str]], layers: dict[str, int]) -> tuple[list[str], list[list[str]]]:
    upward = sorted(f"{_short(a)} (layer {layers[_short(a)]}) -> {_short(b)} (layer {layers[_short(b)]})"
                    for a, deps in graph.items() for b in deps
                    if layers[_short(b)] > layers[_short(a)] and (_short(a), _short(b)) not in ALLOWED)
    kept = {a: {b for b in deps if (_short(a), _short(b)) not in ALLOWED} for a, deps in graph.items()}
    return upward, [[_short(m) for m in c] for c in _cycles(kept)]


def test_every_row_of_the_layer_table_names_a_module():
    graph = _import_graph(lazy=True)
    shorts = {_short(m) for m in graph}
    assert [r for r in _layer_table() if r not in shorts] == []


def test_imports_follow_the_layer_table():
    """Every import, function-level ones included, goes to the importer's layer or a lower one, and there is no
    import cycle at all, except the allow-listed imports."""
    graph = _import_graph(lazy=True)
    upward, cycles = _broken_rules(graph, _layers(graph))
    assert upward == [], "imports that run upward (docs/architecture.md, Layers):\n" + "\n".join(upward)
    assert cycles == [], f"import cycles: {cycles}"


STAGES_LAYER = 4
# (importing stage, imported stage): convert's last step is the calibration
STAGE_IMPORTS = {("convert", "calibrate"), ("convert", "calibration_data"), ("calibrate", "calibration_data")}


def test_stages_do_not_import_each_other():
    """quantize measures through validate's engines (layer 3), not validate's stage; only convert calls calibrate."""
    graph = _import_graph(lazy=True)
    layers = _layers(graph)
    top = {m: _short(m).split(".")[0] for m in graph}
    cross = sorted(f"{_short(a)} -> {_short(b)}" for a, deps in graph.items() for b in deps
                   if layers[_short(a)] == layers[_short(b)] == STAGES_LAYER and top[a] != top[b]
                   and (top[a], top[b]) not in STAGE_IMPORTS)
    assert cross == []


def _top(module: str) -> str:
    """The top-level package (or module) of ``eagle_migrate.a.b``: ``a``; the root package itself: ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, deps in graph.items():
        out.setdefault(_top(a), set()).update(_top(b) for b in deps if _top(b) != _top(a))
    for deps in list(out.values()):
        for b in deps:
            out.setdefault(b, set())
    return out


def test_no_cycle_between_top_level_packages():
    """The import graph with each top-level package as one node (every import, function-level and TYPE_CHECKING
    ones included) has no cycle: the registries (convert/registry.py, quant/registry.py, engines/registry.py) import
    none of their members, no stage reaches back into a package that imports it, and the loader (loader.py) sits
    above drafter, formats and quant, which it reads; aux_ids is part of formats, whose traps it reports."""
    assert _cycles(_package_graph(_import_graph(lazy=True))) == []


def test_the_package_check_finds_a_cycle_no_module_cycle_shows():
    graph = {"eagle_migrate.a.x": {"eagle_migrate.b.y"}, "eagle_migrate.b.y": set(),
             "eagle_migrate.b.z": {"eagle_migrate.a.w"}, "eagle_migrate.a.w": set()}
    assert _cycles(graph) == []  # no module imports itself back
    assert _cycles(_package_graph(graph)) == [["a", "b"]]


def test_the_registries_import_none_of_their_members():
    """A registry module is imported by its members, never the other way (the built-in members are imported by
    the module that uses them: convert/base.py, quant/__init__.py, validate/api.py)."""
    graph = _import_graph(lazy=True)
    for registry, members in (("eagle_migrate.convert.registry", ("eagle_migrate.convert.eagle2", "eagle_migrate.convert.eagle3",
                                                                  "eagle_migrate.convert.passthrough")),
                              ("eagle_migrate.quant.registry", ("eagle_migrate.quant.schemes", "eagle_migrate.quant.handlers")),
                              ("eagle_migrate.engines.registry", ("eagle_migrate.engines.in_process", "eagle_migrate.engines.server"))):
        assert not graph[registry] & set(members), registry
        assert all(registry in graph[m] for m in members), registry


def test_allow_list_is_not_stale():
    graph = _import_graph(lazy=True)
    edges = {(_short(a), _short(b)) for a, deps in graph.items() for b in deps}
    assert sorted(e for e in ALLOWED if e not in edges) == []


def test_the_layer_check_finds_an_upward_import_and_a_cycle():
    graph = {"eagle_migrate.errors": {"eagle_migrate.cli"}, "eagle_migrate.cli": set(),
             "eagle_migrate.formats.io": {"eagle_migrate.formats.base"},
             "eagle_migrate.formats.base": {"eagle_migrate.formats.io"}}
    upward, cycles = _broken_rules(graph, _layers(graph))
    assert upward == ["errors (layer 0) -> cli (layer 6)"]
    assert cycles == [["formats.base", "formats.io"]]


# ----- docs/architecture.md's Layout: the imports an entry names after `|` are the ones it makes -----------------
# An entry's `| a, b.{c, d}, q.gate` (q. = quantize., p. = publish., a bare name inside a package entry = the
# package's own module first) lists the eagle_migrate modules it imports besides errors and the root package;
# a package entry (`pkg/`) speaks for the whole package's imports outside it, a name covers its submodules, words in
# parentheses are notes and the third-party names below are skipped.
LAYOUT_THIRD_PARTY = {"hf_hub", "torch", "pydantic", "compressed-tensors", "transformers", "numpy", "httpx"}


def _layout_entries() -> list[tuple[str, str]]:
    """(module, the text after its last `|`) of every Layout entry that has one."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries: list[list[str]] = []
    pkg = None
    for line in block.splitlines():
        m = re.match(r"^( {2}| {4})(\S+)\s", line)
        if m:
            name = m.group(2).removesuffix(".py")
            if len(m.group(1)) == 2:
                pkg = name.rstrip("/") if name.endswith("/") else None
                entries.append([name.rstrip("/"), line])
            else:
                entries.append([f"{pkg}.{name}" if pkg else name, line])
        elif entries:
            entries[-1][1] += " " + line
    out = []
    for mod, body in entries:
        flat = re.sub(r"`[^`]*`", "", " ".join(body.split()))  # a quoted `|` is prose
        if " | " in flat:
            out.append((mod, flat.rsplit(" | ", 1)[1]))
    return out


def _layout_names(module: str, tail: str, modules: set[str]) -> list[str]:
    """The modules a Layout entry's `|` list names, resolved (``module`` the entry's, relative to the package)."""
    while (t := re.sub(r"\([^()]*\)", "", tail)) != tail:
        tail = t
    pkg = module.split(".")[0]
    out = []
    for item in re.findall(r"[\w-]+(?:\.[\w]+)*(?:\.\{[^}]*\}|\.\*)?", tail):
        if item in LAYOUT_THIRD_PARTY:
            continue
        base, _, rest = item.partition(".{")
        names = [f"{base}.{x.strip()}" for x in rest.rstrip("}").split(",")] if rest else [item.removesuffix(".*")]
        for n in names:
            head, _, sub = n.partition(".")
            n = {"q": "quantize", "p": "publish"}.get(head, head) + ("." + sub if sub else "")
            out.append(f"{pkg}.{n}" if f"{pkg}.{n}" in modules and "." in module else n)
    return out


def _layout_problems(module: str, tail: str, graph: dict[str, set[str]]) -> list[str]:
    modules = {_short(m) for m in graph}
    members = [m for m in graph if _short(m) == module or _short(m).startswith(module + ".")]
    is_package = any(_short(m).startswith(module + ".") for m in members)
    imported = {_short(d) for m in members for d in graph[m]} - {"", "errors"}
    if is_package:
        imported = {d for d in imported if not (d == module or d.startswith(module + "."))}
    named = _layout_names(module, tail, modules)

    def covers(n: str, d: str) -> bool:
        return d == n or d.startswith(n + ".")

    out = [f"{module}: names {n}, no such module" for n in named if n not in modules and n != "errors"]
    out += [f"{module}: names {n}, which it does not import" for n in named
            if n in modules and n != "errors" and not any(covers(n, d) for d in imported)]
    out += [f"{module}: imports {d}, which it does not name" for d in sorted(imported)
            if not any(covers(n, d) for n in named)]
    return out


def test_the_layout_names_the_imports_each_entry_makes():
    graph = _import_graph(lazy=True)
    entries = _layout_entries()
    assert len(entries) >= 20
    found = [p for module, tail in entries for p in _layout_problems(module, tail, graph)]
    assert found == [], "docs/architecture.md, Layout: the `|` lists disagree with the imports:\n" + "\n".join(found)


def test_the_layout_check_finds_a_wrong_and_a_missing_import():
    graph = {"eagle_migrate.quantize.gate": {"eagle_migrate.corpora", "eagle_migrate.quantize.options",
                                             "eagle_migrate.errors", "eagle_migrate.engines.metrics"},
             "eagle_migrate.quantize.options": set(), "eagle_migrate.corpora": set(), "eagle_migrate.errors": set(),
             "eagle_migrate.engines.metrics": set(), "eagle_migrate.target": set()}
    assert _layout_problems("quantize.gate", "corpora, engines.metrics, q.options, hf_hub", graph) == []
    assert _layout_problems("quantize.gate", "corpora (prompts), target, q.{options}", graph) == [
        "quantize.gate: names target, which it does not import",
        "quantize.gate: imports engines.metrics, which it does not name"]


# ----- function-level imports: each says why it is lazy, and none repeats a module-level one ------------------------
# An import inside a function (of eagle_migrate or a third-party package; the standard library's are free) is there
# only to keep a heavy or optional library out of a path that does not need it (`--help`, `inspect`, a vLLM-only
# Python), or to break a cycle. It says which, on its line (`# lazy: <reason>`) or in a `# lazy:` comment line
# directly above it. One that re-imports a module the file already imports at module level gains nothing and must go.
LAZY_MARK = re.compile(r"#\s*lazy:\s*\S")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules an import statement loads (relative ones resolved against ``module``); ``from m import n`` loads
    ``m.n`` when that is a module of the package (``known``), else ``m``."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return {f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports_by_level(tree: ast.Module) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """(the imports that run when the module is imported: module level, class bodies, ``if`` / ``try`` blocks, not
    ``TYPE_CHECKING``; the imports inside functions)."""
    top: list[ast.stmt] = []
    lazy: list[ast.stmt] = []

    def walk(nodes: list[ast.stmt], in_function: bool) -> None:
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                (lazy if in_function else top).append(n)
                continue
            if _is_type_checking(n) and not in_function:
                walk(n.orelse, in_function)
                continue
            inner = in_function or isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody", "handlers"):
                walk(getattr(n, field, None) or [], inner)

    walk(tree.body, False)
    return top, lazy


def _counted(targets: set[str]) -> bool:
    """An import the rules count: of eagle_migrate or a third-party package (not the standard library, not
    ``__future__``)."""
    return any(t.split(".")[0] not in sys.stdlib_module_names and t != "__future__" for t in targets)


def _lazy_import_problems(src: str, module: str, is_package: bool, known: set[str]) -> tuple[list[str], list[str]]:
    """(function-level imports without a ``# lazy:`` reason, function-level imports of a module the file already
    imports at module level), each as ``line: statement``."""
    lines = src.splitlines()
    top, lazy = _imports_by_level(ast.parse(src))
    loaded: set[str] = set()
    for n in top:
        for t in _import_targets(n, module, is_package, known):
            parts = t.split(".")
            loaded.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # a module's packages load with it

    def reason(n: ast.stmt) -> bool:
        if any(LAZY_MARK.search(lines[i - 1]) for i in range(n.lineno, n.end_lineno + 1)):
            return True
        above = lines[n.lineno - 2].strip() if n.lineno > 1 else ""
        return above.startswith("#") and bool(LAZY_MARK.search(above))

    unmarked, again = [], []
    for n in sorted(lazy, key=lambda n: n.lineno):
        targets = _import_targets(n, module, is_package, known)
        if not _counted(targets):
            continue
        where = f"{n.lineno}: {lines[n.lineno - 1].strip()}"
        if not reason(n):
            unmarked.append(where)
        if targets <= loaded:
            again.append(where)
    return unmarked, again


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for p in sorted((ROOT / "eagle_migrate").rglob("*.py"))}


def test_every_function_level_import_says_why_it_is_lazy():
    sources = _package_sources()
    found = [f"{m}:{w}" for m, (src, pkg) in sources.items() for w in _lazy_import_problems(src, m, pkg, set(sources))[0]]
    assert found == [], "function-level imports without a '# lazy: <reason>' comment:\n" + "\n".join(found)


def test_no_function_level_import_repeats_a_module_level_one():
    sources = _package_sources()
    found = [f"{m}:{w}" for m, (src, pkg) in sources.items() for w in _lazy_import_problems(src, m, pkg, set(sources))[1]]
    assert found == [], "function-level imports of modules the file imports at module level:\n" + "\n".join(found)


def test_the_lazy_import_checks_find_a_missing_reason_and_a_repeated_import():
    known = {"eagle_migrate", "eagle_migrate.errors", "eagle_migrate.formats", "eagle_migrate.formats.io",
             "eagle_migrate.formats.base", "eagle_migrate.target"}
    src = '''
from typing import TYPE_CHECKING

import numpy

from .base import Finding
from ..errors import CheckpointError

if TYPE_CHECKING:
    from ..target import Target


def f():
    import json  # the standard library: free
    import torch  # lazy: torch stays out of inspect
    # lazy: transformers, only to load the model
    from transformers import AutoConfig
    from transformers import AutoModel
    from ..target import load_target  # lazy: torch
    import safetensors
    from .io import read_json  # lazy: not imported above (base is, not io)
    from ..errors import InputError  # lazy: but errors is imported above
    import numpy.linalg  # lazy: numpy is imported above, numpy.linalg is not
    from . import base  # lazy: but base is imported above


class C:
    def g(self):
        from .. import errors
'''
    unmarked, again = _lazy_import_problems(src, "eagle_migrate.formats.sizes", False, known)
    # the comment line above AutoConfig covers AutoConfig only; AutoModel, safetensors and C.g's errors say nothing
    assert [w.split(":")[0] for w in unmarked] == ["18", "20", "29"]
    # errors, formats.base and C.g's errors are imported at module level; target only under TYPE_CHECKING
    assert [w.split(":")[0] for w in again] == ["22", "24", "29"]
    assert _lazy_import_problems("def f():\n    import json\n", "eagle_migrate.x", False, known) == ([], [])


# ----- a module docstring's "Imports:" sentence names what the module imports --------------------------------------
# The sentence after "Imports:" (up to its first period followed by a space) lists the top-level packages the module
# imports, any way (function-level and TYPE_CHECKING imports included), and the third-party libraries it names are
# imported; words in parentheses, the submodules in ``pkg.{a, b}`` or ``pkg.a/b``, the module's own package and the
# root package (``__version__``) are not compared. A package's ``__init__`` speaks for the whole package.
THIRD_PARTY = {"torch": "torch", "pydantic": "pydantic", "numpy": "numpy", "transformers": "transformers",
               "huggingface_hub": "huggingface_hub", "compressed-tensors": "compressed_tensors", "httpx": "httpx",
               "prometheus_client": "prometheus_client", "safetensors": "safetensors", "matplotlib": "matplotlib",
               "datasets": "datasets", "vllm": "vllm", "typer": "typer", "rich": "rich"}


def _imports_sentence(doc: str) -> str | None:
    m = re.search(r"\bImports:\s(.*?)(?:\.\s|\.?$)", doc, flags=re.S)
    if m is None:
        return None
    text = m.group(1)
    while (t := re.sub(r"\([^()]*\)", "", text)) != text:  # parentheses, nested ones too
        text = t
    return re.sub(r"\.\{[^}]*\}|(?<=\w)(\.[\w*]+)+(/\w+)*", "", text.replace("``", ""))  # pkg.{a, b}, pkg.a/b -> pkg


def _docstring_imports_problems(doc: str, own: str, imported: set[str], third: set[str], tops: set[str]) -> list[str]:
    """What the "Imports:" sentence of ``doc`` gets wrong: top-level packages named but not imported, imported but not
    named (``imported``: the top-level names the module imports, its own ``own`` and the root excluded), third-party
    libraries named but not imported (``third``: what it imports from outside)."""
    sentence = _imports_sentence(doc)
    if sentence is None:
        return []
    words = set(re.findall(r"[A-Za-z_][\w-]*", sentence))
    named = (words & tops) - {own}
    out = [f"names {n}, which it does not import" for n in sorted(named - imported)]
    out += [f"imports {n}, which it does not name" for n in sorted(imported - named)]
    out += [f"names {w}, which it does not import" for w in sorted(words & set(THIRD_PARTY)) if THIRD_PARTY[w] not in third]
    return out


def _third_party(src: str) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            out.add(n.module.split(".")[0])
    return out


def test_imports_docstrings_name_what_the_module_imports():
    sources = _package_sources()
    graph = _import_graph(lazy=True)
    tops = {_top(m) for m in sources} - {""}
    found = []
    for m, (src, is_package) in sources.items():
        doc = ast.get_docstring(ast.parse(src)) or ""
        members = [x for x in sources if x == m or (is_package and x.startswith(m + "."))]
        imported = {_top(d) for x in members for d in graph[x]} - {_top(m), ""}
        third = set().union(*(_third_party(sources[x][0]) for x in members))
        found += [f"{m}: {p}" for p in _docstring_imports_problems(doc, _top(m), imported, third, tops)]
    assert found == [], "'Imports:' docstrings that disagree with the imports:\n" + "\n".join(found)


def test_the_imports_docstring_check_finds_a_missing_and_a_wrong_name():
    tops = {"errors", "formats", "target", "drafter", "corpora"}
    doc = "Reads things. Imports: torch, ``errors``, drafter (config, model), formats.{io, vllm}, target (lazily). More."
    assert _docstring_imports_problems(doc, "convert", {"errors", "drafter", "formats", "target"}, {"torch"}, tops) == []
    assert _docstring_imports_problems(doc, "convert", {"errors", "drafter", "formats", "corpora"}, set(), tops) == [
        "names target, which it does not import", "imports corpora, which it does not name",
        "names torch, which it does not import"]
    assert _docstring_imports_problems("No such sentence.", "convert", {"errors"}, set(), tops) == []


# ----- size limits: modules <= 500 lines, functions <= 100, except those docs/architecture.md names --------------
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 100


def _long_exceptions() -> set[str]:
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    body = text.split("<!-- long: begin -->", 1)[1].split("<!-- long: end -->", 1)[0]
    return {m.group(1) for line in body.splitlines() if (m := re.match(r"\|\s*`([^`]+)`\s*\|", line.strip()))}


def _too_long() -> set[str]:
    """``pkg/mod.py`` for a module over the limit, ``pkg/mod.func`` (``Class.method``) for a function over it."""
    import ast

    out: set[str] = set()
    for p in sorted((ROOT / "eagle_migrate").rglob("*.py")):
        rel = p.relative_to(ROOT / "eagle_migrate").as_posix()
        src = p.read_text(encoding="utf-8")
        if src.count("\n") > MAX_MODULE_LINES:
            out.add(rel)
        stack: list[tuple[ast.AST, str]] = [(n, "") for n in ast.parse(src).body]
        while stack:
            node, prefix = stack.pop()
            if isinstance(node, ast.ClassDef):
                stack += [(n, f"{prefix}{node.name}.") for n in node.body]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    out.add(f"{rel.removesuffix('.py')}.{prefix}{node.name}")
    return out


def test_modules_and_functions_stay_short_or_are_named_with_a_reason():
    named, found = _long_exceptions(), _too_long()
    assert sorted(found - named) == [], "over the size limits and not named in docs/architecture.md (Size limits)"
    assert sorted(named - found) == [], "named in docs/architecture.md (Size limits) but no longer over the limit"


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


def test_no_options_module_imports_torch():
    """Issue 52: the options models (each stage's one options model and their base) import no torch at module level
    (a torch type only under TYPE_CHECKING, torch itself only inside the functions that need it)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "eagle_migrate"
    mods = ["options.py", "convert/options.py", "calibrate/settings.py", "quantize/options.py", "engines/options.py",
            "publish/options.py"]
    for m in mods:
        tree = ast.parse((root / m).read_text(encoding="utf-8"))
        for node in tree.body:  # module level only; `if TYPE_CHECKING:` blocks are not Import nodes here
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), (m, names)
            assert not (isinstance(node, ast.ImportFrom) and node.level and node.module == "train"), \
                f"{m} imports the trainer (torch) at module level"
