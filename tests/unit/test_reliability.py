"""Issue 17: never lose a user's files, never trust stale or damaged results (docs/reliability.md)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from eagle_migrate import toy
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
        migrate(drafter, str(target), data, MigrateOptions(data=str(data)))
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
    from eagle_migrate.formats.io import atomic_output_dir

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
    assert bad[-1] in err and "error:" in err
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
