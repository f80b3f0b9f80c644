"""The resumable pipeline: manifest, skipping, resuming after failures, gates, and a real kill in the middle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagle_migrate.errors import CheckFailed, InputError
from eagle_migrate.pipeline import MANIFEST_NAME, Manifest, Pipeline, Stage, StageResult

REPO = Path(__file__).resolve().parents[2]


class Counter:
    """Counts stage runs in a folder outside the pipeline's (stage folders are replaced on re-runs)."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def hit(self, name: str) -> None:
        with open(self.folder / name, "a") as f:
            f.write("x")

    def __getitem__(self, name: str) -> int:
        p = self.folder / name
        return len(p.read_text()) if p.exists() else 0


def three_stages(c: Counter, src: Path, threshold: float = 1.0, fail_b: list | None = None) -> list[Stage]:
    def a(ctx):
        c.hit("a")
        (ctx.out / "a.txt").write_text(src.read_text().upper())
        return {"file": ctx.out / "a.txt", "n": 1, "as_text": str(ctx.out / "a.txt"), "elsewhere": "/x/y"}

    def b(ctx):
        c.hit("b")
        if fail_b:
            raise fail_b.pop(0)
        text = (ctx.path("a") / "a.txt").read_text()
        (ctx.out / "b.txt").write_text(text[::-1])
        score = float(len(text))
        return StageResult(outputs={"score": score}, gate_passed=score >= ctx.inputs["threshold"], message=f"score {score}")

    def c_(ctx):
        c.hit("c")
        (ctx.out / "c.txt").write_text("ok")

    return [
        Stage("a", a, {"src": src}),
        Stage("b", b, lambda results: {"threshold": threshold, "a_n": results["a"]["n"]}),
        Stage("c", c_, {}),
    ]


@pytest.fixture
def setup(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("hello")
    return tmp_path / "out", src, Counter(tmp_path / "counts")


def manifest(out: Path) -> Manifest:
    return Manifest.model_validate_json((out / MANIFEST_NAME).read_text())


def test_runs_all_then_skips_all(setup):
    out, src, c = setup
    r = Pipeline(out, three_stages(c, src)).run()
    assert r.ok and r.exit_code == 0 and [s.action for s in r.stages] == ["ran"] * 3
    m = manifest(out)
    assert [s.status for s in m.stages.values()] == ["done"] * 3
    # paths (and strings naming them) inside the temporary folder rewritten to their final place
    assert m.stages["a"].outputs == {"file": "a/a.txt", "n": 1, "as_text": "a/a.txt", "elsewhere": "/x/y"}
    assert m.stages["b"].gate_passed is True and m.stages["b"].message == "score 5.0"
    assert (out / "b" / "b.txt").read_text() == "OLLEH"
    assert all(s.inputs_hash and s.started_at and s.finished_at for s in m.stages.values())
    r2 = Pipeline(out, three_stages(c, src)).run()
    assert r2.ok and [s.action for s in r2.stages] == ["skipped"] * 3
    assert (c["a"], c["b"], c["c"]) == (1, 1, 1)
    json.loads(r2.model_dump_json())  # the one JSON summary
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "c", MANIFEST_NAME]


def test_changed_inputs_rerun_that_stage_and_everything_after(setup):
    out, src, c = setup
    Pipeline(out, three_stages(c, src)).run()
    r = Pipeline(out, three_stages(c, src, threshold=2.0)).run()
    assert [s.action for s in r.stages] == ["skipped", "ran", "ran"]
    src.write_text("changed")  # a Path input is hashed by content
    r = Pipeline(out, three_stages(c, src, threshold=2.0)).run()
    assert [s.action for s in r.stages] == ["ran", "ran", "ran"]
    assert (c["a"], c["b"], c["c"]) == (2, 3, 3)
    r = Pipeline(out, three_stages(c, src, threshold=2.0)).run(force=True)
    assert [s.action for s in r.stages] == ["ran"] * 3


def test_missing_stage_folder_is_rerun(setup):
    out, src, c = setup
    Pipeline(out, three_stages(c, src)).run()
    import shutil

    shutil.rmtree(out / "b")
    r = Pipeline(out, three_stages(c, src)).run()
    assert [s.action for s in r.stages] == ["skipped", "ran", "skipped"]


def test_failure_stops_and_resume_starts_at_the_failed_stage(setup):
    out, src, c = setup
    r = Pipeline(out, three_stages(c, src, fail_b=[InputError("bad data", "fix it")])).run()
    assert not r.ok and r.exit_code == 2 and r.failed_stage == "b"
    assert [(s.status, s.action) for s in r.stages] == [("done", "ran"), ("failed", "ran"), ("pending", "not-run")]
    assert r.stages[1].error == "bad data"
    m = manifest(out)
    assert m.stages["b"].status == "failed" and m.stages["b"].error_type == "InputError" and m.stages["b"].exit_code == 2
    assert not (out / "b").exists() and not (out / "c").exists()
    r = Pipeline(out, three_stages(c, src)).run()
    assert r.ok and [s.action for s in r.stages] == ["skipped", "ran", "ran"]
    assert (c["a"], c["b"], c["c"]) == (1, 2, 1)
    assert manifest(out).stages["b"].attempts == 2


def test_gate_failure_keeps_output_and_exits_1(setup):
    out, src, c = setup
    r = Pipeline(out, three_stages(c, src, threshold=99)).run()
    assert r.exit_code == 1 and r.failed_stage == "b" and r.stages[1].gate_passed is False
    assert (out / "b" / "b.txt").exists() and not (out / "c").exists()
    r = Pipeline(out, three_stages(c, src, threshold=99)).run()  # same inputs: same verdict, nothing recomputed
    assert r.exit_code == 1 and [s.action for s in r.stages] == ["skipped", "skipped", "not-run"]
    assert c["b"] == 1
    r = Pipeline(out, three_stages(c, src, threshold=1)).run()
    assert r.ok and [s.action for s in r.stages] == ["skipped", "ran", "ran"]


def test_check_failed_discards_output(setup):
    out, src, c = setup
    r = Pipeline(out, three_stages(c, src, fail_b=[CheckFailed("AL 1.2 < 2.0")])).run()
    assert r.exit_code == 1 and r.stages[1].error == "AL 1.2 < 2.0" and not (out / "b").exists()


def test_unexpected_errors_are_recorded_and_raised(setup):
    out, src, c = setup
    with pytest.raises(ZeroDivisionError):
        Pipeline(out, three_stages(c, src, fail_b=[ZeroDivisionError("boom")])).run()
    m = manifest(out)
    assert m.stages["b"].status == "failed" and m.stages["b"].error == "unexpected ZeroDivisionError: boom"
    assert not (out / ".migrate.lock").exists()
    assert Pipeline(out, three_stages(c, src)).run().ok


def test_lock_and_corrupt_manifest(setup):
    out, src, c = setup
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".migrate.lock").write_text(str(sleeper.pid))
        with pytest.raises(InputError, match=f"pid {sleeper.pid}"):
            Pipeline(out, three_stages(c, src)).run()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert Pipeline(out, three_stages(c, src)).run().ok  # the holder is gone: stale lock taken over
    (out / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(InputError, match="manifest"):
        Pipeline(out, three_stages(c, src)).run()


def test_bad_pipelines(tmp_path):
    with pytest.raises(ValueError):
        Stage("Bad Name", lambda ctx: None)
    with pytest.raises(ValueError):
        Pipeline(tmp_path, [Stage("a", lambda ctx: None), Stage("a", lambda ctx: None)])
    ck = tmp_path / "ckpt"
    ck.mkdir()
    with pytest.raises(InputError, match="overlaps"):
        Pipeline(ck / "out", [], protect=[ck])
    with pytest.raises(TypeError, match="stage input a.x"):
        Pipeline(tmp_path / "o", [Stage("a", lambda ctx: None, {"x": object()})]).run()


# ----- a real kill in the middle ------------------------------------------------------------------------------
TOY = textwrap.dedent('''
    import os, sys, time, json
    from pathlib import Path
    from eagle_migrate.pipeline import Pipeline, Stage

    out, counts = Path(sys.argv[1]), Path(sys.argv[2])
    sleep = float(os.environ.get("TOY_SLEEP", "0"))

    def hit(name):
        with open(counts / name, "a") as f:
            f.write("x")

    def one(ctx):
        hit("one")
        (ctx.out / "weights.bin").write_bytes(b"1" * 1000)
        return {"size": 1000}

    def two(ctx):
        hit("two")
        (ctx.out / "part-1.bin").write_bytes(b"2" * 1000)
        (counts / "two-started").write_text(str(os.getpid()))
        time.sleep(sleep)  # killed here: a half-written stage folder exists only as a temporary sibling
        (ctx.out / "part-2.bin").write_bytes(b"2" * 1000)
        return {"parts": 2}

    def three(ctx):
        hit("three")
        parts = sorted(p.name for p in ctx.path("two").iterdir())
        assert parts == ["part-1.bin", "part-2.bin"], parts
        (ctx.out / "done.txt").write_text("ok")

    r = Pipeline(out, [Stage("one", one, {"k": 1}), Stage("two", two, {"k": 2}), Stage("three", three, {"k": 3})]).run()
    print(r.model_dump_json())
    sys.exit(r.exit_code)
''')


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_kill_in_the_middle_then_resume(tmp_path, sig):
    script = tmp_path / "toy_pipeline.py"
    script.write_text(TOY)
    out, counts = tmp_path / "out", tmp_path / "counts"
    counts.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TOY_SLEEP="60")
    p = subprocess.Popen([sys.executable, str(script), str(out), str(counts)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (counts / "two-started").exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "stage two never started"
            time.sleep(0.05)
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    m = manifest(out)
    assert m.stages["one"].status == "done" and "three" not in m.stages
    assert not (out / "two").exists()  # never a half-written stage folder under its real name
    if sig == signal.SIGKILL:
        assert p.returncode == -signal.SIGKILL
        assert m.stages["two"].status == "running"
        assert any(x.name.startswith(".two.tmp-") for x in out.iterdir())  # what a kill leaves behind
    else:
        assert p.returncode == 128 + signal.SIGTERM, stderr
        res = json.loads(stdout)
        assert res["interrupted"] and res["failed_stage"] == "two"
        assert m.stages["two"].status == "failed" and "interrupted" in m.stages["two"].error
        assert not any(x.name.startswith(".two.tmp-") for x in out.iterdir())

    env["TOY_SLEEP"] = "0"
    r = subprocess.run([sys.executable, str(script), str(out), str(counts)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [s["action"] for s in res["stages"]] == ["skipped", "ran", "ran"]
    assert [(counts / n).read_text() for n in ("one", "two", "three")] == ["x", "xx", "x"]
    assert sorted(x.name for x in out.iterdir()) == [MANIFEST_NAME, "one", "three", "two"]
    assert sorted(x.name for x in (out / "two").iterdir()) == ["part-1.bin", "part-2.bin"]
    m = manifest(out)
    assert [s.status for s in m.stages.values()] == ["done"] * 3 and m.stages["two"].attempts == 2


def test_publish_as_a_stage(toy_oracle, tmp_path):
    """How migrate wires publish: the stage writes the repo folder inside its own folder; outputs are JSON."""
    from eagle_migrate.publish import publish

    def validate(ctx):
        (ctx.out / "report.json").write_text(json.dumps({"passed": True, "num_speculative_tokens": 2}))
        return {"passed": True}

    def pub(ctx):
        res = publish(ctx.inputs["checkpoint"], ctx.inputs["repo_id"], report_dir=ctx.path("validate"),
                      dry_run=True, out_dir=ctx.out / "repo")
        return StageResult(outputs=res.model_dump(mode="json"), message=f"{len(res.files)} files")

    stages = [Stage("validate", validate, {"checkpoint": toy_oracle}),
              Stage("publish", pub, {"checkpoint": toy_oracle, "repo_id": "o/n", "dry_run": True})]
    out = tmp_path / "out"
    r = Pipeline(out, stages, protect=[toy_oracle]).run()
    assert r.ok, r
    outs = r.stages[1].outputs
    assert outs["out_dir"] == "publish/repo" and outs["num_speculative_tokens"] == 2
    assert json.loads((out / "publish" / "repo" / "speculative_config.json").read_text())["num_speculative_tokens"] == 2
    assert [s.action for s in Pipeline(out, stages).run().stages] == ["skipped", "skipped"]
