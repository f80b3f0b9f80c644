"""Issue 17: never lose a user's files, never trust stale or damaged results (docs/reliability.md)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from eagle_migrate.errors import InputError, OutputExistsError

KW = dict(num_sequences=4, command="test", calibrate=False, evaluate=False)


def tree_hash(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(p).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def pair(tmp_path, toy_target, toy_oracle) -> tuple[Path, Path]:
    """A private copy of the toy target and drafter, with an unrelated file beside them."""
    t, d = tmp_path / "models" / "target", tmp_path / "models" / "drafter"
    shutil.copytree(toy_target, t)
    shutil.copytree(toy_oracle, d)
    (tmp_path / "models" / "notes.txt").write_text("the user's own file")
    return t, d


# ----- 1. an output never destroys an input -----------------------------------------------------------------------
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("where", ["target", "parent", "inside", "symlink"])
def test_convert_refuses_an_output_that_overlaps_the_target(pair, tmp_path, where, force):
    from eagle_migrate.convert import convert

    target, drafter = pair
    out = {"target": target, "parent": target.parent, "inside": target / "sub", "symlink": tmp_path / "link"}[where]
    if where == "symlink":
        out.symlink_to(target, target_is_directory=True)
    before, beside = tree_hash(target.parent), (target.parent / "notes.txt").read_text()
    with pytest.raises(InputError, match="refusing") as e:
        convert(drafter, str(target), out, force=force, **KW)
    assert e.value.exit_code == 2
    assert tree_hash(target.parent) == before and (target.parent / "notes.txt").read_text() == beside


@pytest.mark.parametrize("force", [False, True])
def test_quantize_refuses_an_output_that_overlaps_an_input(pair, force):
    from eagle_migrate.quantize import quantize

    target, drafter = pair
    before = tree_hash(target.parent)
    for out in (target, target.parent, drafter):
        with pytest.raises(InputError, match="refusing"):
            quantize(drafter, out, "fp8-dynamic", target=str(target), validate="none", force=force)
    assert tree_hash(target.parent) == before


def test_migrate_refuses_an_output_that_overlaps_target_or_data(pair, tmp_path):
    from eagle_migrate.migrate import MigrateOptions, migrate

    target, drafter = pair
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello"}\n')
    before = tree_hash(target.parent)
    for out in (target, target.parent, target / "run"):
        with pytest.raises(InputError, match="refusing"):
            migrate(drafter, str(target), out)
    with pytest.raises(InputError, match="refusing"):
        migrate(drafter, str(target), data, MigrateOptions.of(data=str(data)))
    assert tree_hash(target.parent) == before and data.read_text() == '{"text": "hello"}\n'


def test_force_replaces_only_a_folder_this_tool_wrote(pair, tmp_path):
    from eagle_migrate.convert import convert

    target, drafter = pair
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"\xff\xd8 not ours")
    with pytest.raises(OutputExistsError, match="did not write"):
        convert(drafter, str(target), foreign, force=True, **KW)
    assert (foreign / "holiday.jpg").read_bytes() == b"\xff\xd8 not ours"

    ours = tmp_path / "ours"
    convert(drafter, str(target), ours, **KW)
    with pytest.raises(OutputExistsError):
        convert(drafter, str(target), ours, **KW)  # exists, no --force
    (ours / "stale.txt").write_text("x")
    convert(drafter, str(target), ours, force=True, seed=1, **KW)  # ours: replaced
    assert not (ours / "stale.txt").exists() and (ours / "model.safetensors").is_file()


def test_migrate_refuses_a_non_empty_folder_that_is_not_a_run(pair, tmp_path):
    from eagle_migrate.migrate import migrate

    target, drafter = pair
    home = tmp_path / "home"
    (home / "convert").mkdir(parents=True)
    (home / "convert" / "thesis.tex").write_text("years of work")
    with pytest.raises(OutputExistsError, match="not an eagle-migrate run folder"):
        migrate(drafter, str(target), home)
    assert (home / "convert" / "thesis.tex").read_text() == "years of work"


def test_two_converts_into_one_new_output_the_loser_exits_2(pair, tmp_path):
    """The rename into -o is checked when it happens: a second convert that finishes while the first one runs
    wins; the first one fails with exit 2 and leaves the winner's output untouched (nothing mixed)."""
    from eagle_migrate.convert import convert

    target, drafter = pair
    out = tmp_path / "out"
    other = {}

    def progress(stage, done, total):
        if stage == "write" and done == total and not other:  # inside the first run's atomic block
            other["res"] = convert(drafter, str(target), out, seed=7, **KW)
            other["hash"] = tree_hash(out)

    with pytest.raises(OutputExistsError, match="another process") as e:
        convert(drafter, str(target), out, progress=progress, **KW)
    assert e.value.exit_code == 2
    assert tree_hash(out) == other["hash"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_atomic_output_dir_checks_at_rename_time(tmp_path):
    from eagle_migrate.formats.output import atomic_output_dir

    out = tmp_path / "o"
    with pytest.raises(OutputExistsError):
        with atomic_output_dir(out) as a:
            (a / "a.txt").write_text("first")
            with atomic_output_dir(out) as b:
                (b / "b.txt").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["o"]


# ----- 3. fail before work, with the right code --------------------------------------------------------------------
def _main(args: list[str], capsys) -> tuple[int, str, str]:
    from eagle_migrate import cli

    with pytest.raises(SystemExit) as e:
        cli.main(args)
    got = capsys.readouterr()
    return e.value.code, got.out, got.err


@pytest.mark.parametrize("bad", [["--quantize", "int3"], ["--validate", "--suite", "bogus"],
                                 ["--validate", "--engine", "bogus"], ["--validate", "--prompts", "/no/such/prompts.jsonl"],
                                 ["--validate", "--publish", "not a repo id"]])
def test_every_bad_migrate_option_fails_before_the_first_stage(pair, tmp_path, capsys, monkeypatch, bad):
    monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)
    target, drafter = pair
    out = tmp_path / "run"
    code, stdout, err = _main(["migrate", str(drafter), "--target", str(target), "-o", str(out), *bad], capsys)
    assert code == 2, err
    # --engine is one shared flag (cli/options.py, as validate's and convert's): the engine registry refuses the
    # value before the first stage, naming the registered engines
    assert bad[-1] in err and ("expected auto or one of vllm, reference" if bad[1] == "--engine" else "error:") in err
    assert not out.exists()  # not one stage ran


def test_unwritable_output_exits_2_before_work(pair, capsys, monkeypatch):
    monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)
    target, drafter = pair
    code, _, err = _main(["migrate", str(drafter), "--target", str(target), "-o", "/proc/eagle-migrate-x"], capsys)
    assert code == 2 and "/proc/eagle-migrate-x" in err and "bug" not in err
    code, _, err = _main(["convert", str(drafter), "--target", str(target), "-o", "/proc/eagle-migrate-x", "--no-calibrate"], capsys)
    assert code == 2 and "/proc/eagle-migrate-x" in err and "bug" not in err


@pytest.mark.parametrize("debug", ["0", "1"])
def test_json_failure_document_and_debug_keeps_the_exit_code(pair, tmp_path, capsys, monkeypatch, debug):
    import json

    monkeypatch.setenv("EAGLE_MIGRATE_DEBUG", debug)
    target, drafter = pair
    code, stdout, err = _main(["migrate", str(drafter), "--target", str(target), "-o", str(tmp_path / "r"),
                               "--quantize", "int3", "--json"], capsys)
    assert code == 2
    doc = json.loads(stdout)
    assert set(doc) == {"error"} and doc["error"]["code"] == "InputError"
    assert "int3" in doc["error"]["message"] and doc["error"]["hint"]
    assert ("Traceback" in err) == (debug == "1")


# ----- 2. resume trusts nothing it has not checked -----------------------------------------------------------------
def _actions(res) -> dict[str, str]:
    return {s.name: s.action for s in res.stages}


def _run_migrate(drafter, target, out, **kw):
    from eagle_migrate.migrate import MigrateOptions, migrate

    opts = MigrateOptions.of(calibrate=False, num_sequences=4, repo_id="o/toy", dry_run=True, run_validate=False, **kw)
    return migrate(drafter, str(target), out, opts)


def test_damaged_stage_outputs_run_again_on_resume(pair, tmp_path):
    import os
    import struct

    target, drafter = pair
    out = tmp_path / "run"
    first = _run_migrate(drafter, target, out)
    assert first.ok and set(_actions(first).values()) == {"ran"}
    assert set(_actions(_run_migrate(drafter, target, out)).values()) == {"skipped"}

    # truncated weights in the publish folder: publish runs again (and only publish)
    pub = out / "publish" / "repo" / "model.safetensors"
    good = pub.read_bytes()
    pub.write_bytes(good[: len(good) // 2])
    res = _run_migrate(drafter, target, out)
    assert res.ok and _actions(res) == {"inspect": "skipped", "convert": "skipped", "publish": "ran"}
    assert pub.read_bytes() == good

    # NaN-corrupted weights (same size, mtime put back): convert runs again, the damage is gone
    conv = out / "convert" / "model" / "model.safetensors"
    good, st = conv.read_bytes(), conv.stat()
    (n,) = struct.unpack("<Q", good[:8])
    bad = bytearray(good)
    bad[8 + n : 8 + n + 64] = struct.pack("<f", float("nan")) * 16
    conv.write_bytes(bytes(bad))
    os.utime(conv, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = _run_migrate(drafter, target, out)
    assert res.ok and _actions(res)["convert"] == "ran"
    assert conv.read_bytes() == good


def test_replaced_target_weights_rerun_convert(pair, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    target, drafter = pair
    out = tmp_path / "run"
    assert _run_migrate(drafter, target, out).ok
    w = target / "model.safetensors"
    sd = load_file(str(w))
    name = next(k for k in sorted(sd) if k.endswith("down_proj.weight"))
    sd[name] = torch.zeros_like(sd[name])  # same names, shapes and size: only the content differs
    save_file(sd, str(w), metadata={"format": "pt"})
    res = _run_migrate(drafter, target, out)
    assert _actions(res)["convert"] == "ran" and _actions(res)["inspect"] == "ran"


def test_force_stage_and_restart(pair, tmp_path):
    from eagle_migrate.errors import InputError as _IE

    target, drafter = pair
    out = tmp_path / "run"
    assert _run_migrate(drafter, target, out).ok
    res = _run_migrate(drafter, target, out, force_stage="convert")
    assert _actions(res) == {"inspect": "skipped", "convert": "ran", "publish": "ran"}
    assert set(_actions(_run_migrate(drafter, target, out, restart=True)).values()) == {"ran"}
    with pytest.raises(_IE, match="--force-stage 'quantize'"):
        _run_migrate(drafter, target, out, force_stage="quantize")


# ----- every stage's hash is exactly its call arguments ------------------------------------------------------------
class _NS(dict):
    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


@pytest.fixture
def fake_stages(monkeypatch):
    """The five library functions replaced by recorders (the pipeline wiring is what is under test)."""
    import eagle_migrate.convert as c
    import eagle_migrate.inspection as i
    import eagle_migrate.publish.stage as p
    import eagle_migrate.quantize.stage as q
    import eagle_migrate.validate.api as v

    calls: dict[str, dict] = {}

    def rec(name, kw):
        calls[name] = kw

    def convert(source, target, out, *, options, progress=None):
        # convert takes its options model whole: recorded by field, the calibration's too (as the flags name them)
        # (convert's own field wins: the calibration's run-wide context, such as dtype, is convert's)
        flat = {**{f: getattr(options.calibration, f) for f in options.calibration.model_fields},
                **{f: getattr(options, f) for f in options.model_fields if f != "calibration"}}
        rec("convert", {**flat, "source": source, "target": target, "out": out})
        out.mkdir()
        return _NS(agreement=_NS(step0=1.0), calibration=_NS(status="x", details=None), calibration_required=False,
                   source_kind=None, defaults="", decision="x")

    def fields(opts):  # a stage's options model, taken whole: recorded by field
        return {f: getattr(opts, f) for f in opts.model_fields}

    def quantize(src, out, opts):
        rec("quantize", fields(opts))
        Path(out).mkdir()
        return _NS(checkpoint_ratio=2.0, scheme=opts.scheme)

    def validate(ckpt, target, opts, **kw):
        rec("validate", {**fields(opts), "target": target})
        return _NS(suites=[], passed=True, engine="reference", engine_version=None, gates=[], failures=[])

    def publish(ckpt, opts, **kw):
        rec("publish", fields(opts))
        return _NS(repo_id=opts.repo_id, dry_run=True, files=[], commit_url=None, pr_url=None)

    monkeypatch.setattr(i, "inspect_checkpoint", lambda **kw: (rec("inspect", kw), _NS(format="f", producer="p", findings=[]))[1])
    monkeypatch.setattr(c, "convert", convert)
    monkeypatch.setattr(q, "run", quantize)
    monkeypatch.setattr(v, "run_validation", validate)
    monkeypatch.setattr(p, "run", publish)
    return calls


CHANGES = [  # (option, new value, the keyword the stage is called with, the first stage that must run again)
    ("device", "cpu", "device", "inspect"), ("dtype", "float32", "dtype", "convert"),  # inspect measures aux ids on the device
    ("aux_ids_convention", "vllm", "aux_ids_convention", "inspect"),
    ("num_speculative_tokens", 4, "num_speculative_tokens", "convert"), ("seed", 1, "seed", "convert"),
    ("steps", 5, "steps", "convert"),
    ("train", "all", "train", "convert"), ("num_sequences", 8, "num_sequences", "convert"),
    ("output_format", "speculators", "output_format", "convert"), ("calibrate", True, "calibrate", "convert"),
    ("max_minutes", 1.0, "max_minutes", "convert"), ("data", "chat", "data", "convert"),
    ("scheme", "nvfp4a16", "scheme", "quantize"), ("quantize_fc", True, "quantize_fc", "quantize"),
    # the engine choice serves the target in calibration too (its held-out continuations): convert runs again
    ("engine", "reference", "engine", "convert"), ("suites", ["code"], "suites", "validate"),
    ("num_prompts", 2, "num_prompts", "validate"), ("max_tokens", 8, "max_tokens", "validate"),
    ("min_acceptance_length", 1.5, "min_acceptance_length", "validate"),
    ("max_regression_pct", 5.0, "max_regression_pct", "validate"), ("vllm_python", "PY", "vllm_python", "convert"),
    ("private", True, "private", "publish"), ("revision", "dev", "revision", "publish"),
    ("create_pr", True, "create_pr", "publish"),
]


@pytest.mark.parametrize("option,value,kwarg,first", CHANGES, ids=[c[0] for c in CHANGES])
def test_each_option_reruns_the_stage_it_reaches(pair, tmp_path, fake_stages, option, value, kwarg, first):
    import sys

    from eagle_migrate.migrate import MigrateOptions, migrate

    target, drafter = pair
    if value == "PY":
        value = sys.executable
    base = dict(scheme="fp8-dynamic", run_validate=True, repo_id="o/n", dry_run=True)
    out = tmp_path / "run"
    assert migrate(drafter, str(target), out, MigrateOptions.of(**base)).ok
    res = migrate(drafter, str(target), out, MigrateOptions.of(**{**base, option: value}))
    order = ["inspect", "convert", "quantize", "validate", "publish"]
    want = {n: ("ran" if order.index(n) >= order.index(first) else "skipped") for n in order}
    assert _actions(res) == want
    assert fake_stages[first][kwarg] == value  # the changed value reached the call the hash stands for
    if option in ("engine", "vllm_python"):  # and every stage that serves the target: validate as well
        assert fake_stages["validate"][kwarg] == value


def test_report_records_the_weights_it_measured_and_publish_checks_them(pair, tmp_path):
    import json
    import struct

    from eagle_migrate.errors import InputError
    from eagle_migrate.formats.io import sha256_files, weight_files
    from eagle_migrate.publish import publish
    from eagle_migrate.validate.api import validate

    target, drafter = pair
    rep = validate(drafter, str(target), suites=["chat"], engine="reference", num_prompts=1, max_tokens=8,
                   diagnostics=False, report_dir=tmp_path / "rep")
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep.passed and doc["weights_sha256"] == sha256_files(weight_files(drafter))
    got = publish(drafter, "o/n", report_dir=tmp_path / "rep", dry_run=True, out_dir=tmp_path / "pub").validation
    assert got.measured and not got.forced and got.passed is None  # measured, no gate set: "passed" is not claimed
    w = drafter / "model.safetensors"
    b = bytearray(w.read_bytes())
    (n,) = struct.unpack("<Q", b[:8])
    b[8 + n : 8 + n + 4] = struct.pack("<f", float("nan"))
    w.write_bytes(bytes(b))
    with pytest.raises(InputError, match="other weights") as ei:  # a refused input: exit 2
        publish(drafter, "o/n", report_dir=tmp_path / "rep", dry_run=True, out_dir=tmp_path / "pub2")
    assert ei.value.exit_code == 2


# ----- 5. children die with the parent -----------------------------------------------------------------------------
FAKE_PARENT = """
import sys
from eagle_migrate.engines.vllm_engine import run_worker
run_worker({"target": "t", "drafter": None, "suites": {}}, python=sys.executable)
"""


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_vllm_worker_dies_with_its_parent(tmp_path):
    """A parent that starts the worker exactly as validate does is SIGKILLed while the worker is busy (here: a
    stand-in ``vllm`` package whose import takes a minute, so no model is loaded); the worker is gone within 2 s."""
    import os
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "fakevllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import pathlib, os, time\n"
                                      f"pathlib.Path({str(tmp_path / 'busy')!r}).write_text(str(os.getpid()))\n"
                                      "time.sleep(60)\n")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(tmp_path / "fakevllm")]))
    parent = subprocess.Popen([sys.executable, "-c", FAKE_PARENT], env=env)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "busy").exists():
            assert parent.poll() is None and time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        worker = int((tmp_path / "busy").read_text())
        assert worker in _children(parent.pid) and _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone = time.monotonic() + 2.0
        while _alive(worker) and time.monotonic() < gone:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its parent by more than 2 s"
    finally:
        if parent.poll() is None:
            parent.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


# ----- 4. what leaves the machine ----------------------------------------------------------------------------------
def test_uploaded_card_and_provenance_hold_no_local_path_or_command_line(pair, tmp_path):
    import json

    from eagle_migrate.convert import convert
    from eagle_migrate.publish import publish
    from eagle_migrate.validate.api import validate

    target, drafter = pair
    conv = tmp_path / "secret-user-home" / "converted"
    convert(drafter, str(target), conv, num_sequences=4, command=f"eagle-migrate convert {drafter} -o {conv} --token x",
            calibrate=False, evaluate=False)
    validate(conv, str(target), suites=["chat"], engine="reference", num_prompts=1, max_tokens=8, baseline=drafter,
             diagnostics=False, report_dir=tmp_path / "rep")
    res = publish(conv, "o/n", report_dir=tmp_path / "rep", dry_run=True, out_dir=tmp_path / "repo")
    assert res.validation.measured and not res.validation.forced
    uploaded = {p.path for p in res.files}
    for rel in uploaded:
        f = tmp_path / "repo" / rel
        if f.suffix in (".md", ".json"):
            text = f.read_text()
            assert str(tmp_path) not in text and "secret-user-home" not in text and "--token" not in text, rel
    prov = json.loads((tmp_path / "repo" / "provenance.json").read_text())
    assert prov["command"] == "eagle-migrate convert" and prov["source"].startswith("<local>/")
    assert str(drafter) in (conv / "provenance.json").read_text()  # the local, not uploaded, record keeps them


def test_credentials_in_hf_endpoint_are_never_printed(toy_oracle, tmp_path):
    import json
    import os
    import socket
    import subprocess
    import sys

    from eagle_migrate.formats.io import sha256_files, weight_files

    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.json").write_text(json.dumps({"passed": True, "num_speculative_tokens": 3,
                                                 "weights_sha256": sha256_files(weight_files(toy_oracle))}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "h"), HF_TOKEN="hf_abcdefghijklmnopqrstuvwxyz",
               HF_ENDPOINT=f"http://alice:s3cretPassw0rd@127.0.0.1:{port}", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for extra in ([], ["--json"]):
        r = subprocess.run([sys.executable, "-m", "eagle_migrate", "publish", str(toy_oracle), "--repo-id", "o/n",
                            "--report", str(rep), *extra], capture_output=True, text=True, env=env, timeout=120,
                           cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert "s3cretPassw0rd" not in r.stdout + r.stderr and "abcdefghijklmnop" not in r.stdout + r.stderr
        assert "127.0.0.1" in r.stdout + r.stderr  # the endpoint is named, without its credentials
        if extra:
            assert json.loads(r.stdout)["error"]["code"] == "HubError"


def test_redact():
    from eagle_migrate.errors import redact

    assert redact("GET https://user:tok3n@hub.example.com/api and ftp://a@b/c") == "GET https://***@hub.example.com/api and ftp://***@b/c"
    assert redact("token hf_abcdefghijkl") == "token hf_***" and redact("https://hub.example.com/x") == "https://hub.example.com/x"


def test_quantize_output_is_byte_identical_run_after_run(toy_oracle, tmp_path):
    from eagle_migrate.quantize import quantize

    digests = set()
    for i in range(4):
        quantize(toy_oracle, tmp_path / f"q{i}", "fp8-dynamic", validate="none")
        digests.add(hashlib.sha256((tmp_path / f"q{i}" / "model.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1


# ----- issue 16 part 4: what a user sees when a stage fails ---------------------------------------------------------
def _failed_run(tmp_path):
    from eagle_migrate.pipeline import Pipeline, Stage

    def bad(ctx):
        raise InputError("kaput-17 happened")

    return Pipeline(tmp_path / "run", [Stage("convert", lambda ctx: None), Stage("validate", bad)]).run()


def test_failed_row_carries_the_error_and_hint_names_force_stage(tmp_path, capsys):
    from eagle_migrate.cli.migrate import render_pipeline

    res = _failed_run(tmp_path)
    capsys.readouterr()
    render_pipeline(res)
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "validate" in ln and "failed" in ln)
    assert "kaput-17" in row
    assert "--force-stage" in res.hint and "--restart" in res.hint and "--force-stage" in out


def test_demo_prints_no_acceptance_table_after_a_failure(tmp_path, capsys, monkeypatch):
    import eagle_migrate.demo as demo_mod
    from eagle_migrate import cli

    res = _failed_run(tmp_path)
    fake = demo_mod.DemoResult(pair="toy", target="t", source="s", out_dir=str(tmp_path), engine=None, rows=[],
                               report=None, repo_folder=None, pipeline=res)
    monkeypatch.setattr(demo_mod, "run_demo", lambda *a, **k: fake)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--out", str(tmp_path / "d")])
    out = capsys.readouterr().out
    assert e.value.code == 2 and "kaput-17" in out
    assert "acceptance length (k=" not in out and "EAGLE-3.1 + fp8" not in out  # no table (the intro text stays)


def test_validate_report_folder_never_lands_in_an_input(pair):
    from eagle_migrate.validate.api import validate

    target, drafter = pair
    before = tree_hash(target.parent)
    for rep in (target, drafter / "report", target.parent):
        with pytest.raises(InputError, match="refusing"):
            validate(drafter, str(target), suites=["chat"], engine="reference", num_prompts=1, max_tokens=4,
                     diagnostics=False, report_dir=rep)
    assert tree_hash(target.parent) == before


def test_command_registration_fails_loudly():
    """A command module that cannot be imported stops the CLI at start instead of silently missing a command: the
    commands are imported and registered explicitly, one line each, in cli/__init__.py."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['eagle_migrate.cli.demo'] = None  # the module cannot be imported\n"
            "try:\n    import eagle_migrate.cli as cli\nexcept ImportError as e:\n    print('refused:', e)\n"
            "else:\n    print('registered:', sorted(c.callback.__name__ for c in cli.app.registered_commands))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("refused:") and "eagle_migrate.cli.demo" in r.stdout, r.stdout
