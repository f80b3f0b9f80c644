"""Long work is never silent: StageBar's plain lines (no TTY, --json) come at least every LOG_EVERY seconds with
the stage, the step and an ETA, and a heartbeat repeats the current stage while the library reports nothing."""

from __future__ import annotations

from eagle_migrate.cli.render import StageBar


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_lines_carry_step_and_eta_and_a_heartbeat_fills_silences(capsys):
    clock = _Clock()
    assert StageBar.LOG_EVERY <= 10
    with StageBar("convert", json_mode=True, clock=clock, heartbeat=False) as bar:
        bar("statistics", 0, 20)
        clock.now += 4
        bar("statistics", 5, 20)  # within LOG_EVERY of the last line: no line
        clock.now += 7
        bar("statistics", 6, 20)  # 11 s since the last line: a line with the ETA of the 14 steps left
        err = capsys.readouterr().err
        assert "convert: statistics 0/20 (0 s)" in err
        assert "statistics 5/20" not in err
        assert "convert: statistics 6/20 (11 s, ETA 26 s)" in err
        clock.now += 30  # the library says nothing for 30 s (a long evaluation): the heartbeat speaks
        bar.tick()
        err = capsys.readouterr().err
        assert "convert: statistics 6/20 (41 s, ETA 96 s) still running" in err
        clock.now += 3
        bar.tick()  # 3 s later: quiet again
        assert capsys.readouterr().err == ""
        bar("statistics", 20, 20)
        capsys.readouterr()
        clock.now += 12
        bar.tick()  # between stages (the library loads the next one's inputs): still a line, naming the last stage
        assert "convert: still running (56 s; statistics done)" in capsys.readouterr().err


def test_migrate_hands_its_progress_to_convert(tmp_path, monkeypatch):
    """migrate (and the demo through it) passes its StageProgress to convert: the statistics and calibration lines
    reach the user instead of one '[convert] running' for minutes."""
    import eagle_migrate.convert as conv
    from eagle_migrate import toy
    from eagle_migrate.errors import CheckFailed
    from eagle_migrate.migrate import MigrateOptions, migrate

    seen = {}

    def fake_convert(*args, **kw):
        seen["progress"] = kw.get("progress")
        raise CheckFailed("stop here")

    monkeypatch.setattr(conv, "convert", fake_convert)
    target, src = toy.write_target(tmp_path / "target"), toy.write_drafter(tmp_path / "src", "oracle")

    def mine(stage, done, total, info=""):
        return None

    res = migrate(src, str(target), tmp_path / "run", MigrateOptions.of(calibrate=False), progress=mine)
    assert res.failed_stage == "convert" and seen["progress"] is mine


def test_a_finished_stage_reported_again_is_not_the_one_in_flight(capsys):
    """convert reports its last write step twice (write, then verify); the heartbeat during the next pipeline stage
    once repeated 'write 16/16 ... still running' for a minute of validate. A finished stage is never current, and
    the pipeline names the stage it starts."""
    clock = _Clock()
    with StageBar("demo", json_mode=True, clock=clock, heartbeat=False) as bar:
        bar("write", 16, 16)
        bar("write", 16, 16)
        capsys.readouterr()
        clock.now += 11
        bar.tick()
        err = capsys.readouterr().err
        assert "write 16/16" not in err and "still running (11 s; write done)" in err
        bar("validate", 0, None)
        clock.now += 11
        bar.tick()
        assert "demo: validate 0 (22 s) still running" in capsys.readouterr().err


def test_the_pipeline_reports_each_stage_it_starts(tmp_path):
    from eagle_migrate.pipeline import Pipeline, Stage

    seen = []
    stages = [Stage(name=n, fn=lambda ctx: {}, inputs={"n": n}) for n in ("a", "b")]
    Pipeline(tmp_path / "run", stages, progress=lambda *a: seen.append(a)).run()
    assert seen == [("a", 0, None, ""), ("b", 0, None, "")]


# ----- the long inner work reports suite by suite / batch by batch (issue 39) --------------------------------------
def test_held_out_continuations_by_transformers_report_each_batch(tmp_path):
    """The slow fallback (transformers' generate) of calibration's held-out set: one event per batch, under a stage
    of its own per suite, so StageBar's line carries the ETA of that suite (it once printed only 'still running')."""
    from eagle_migrate import toy
    from eagle_migrate.calibration_data import heldout_sequences
    from eagle_migrate.target import load_target

    tgt = load_target(str(toy.write_target(tmp_path / "t")), device="cpu", with_tokenizer=False)
    seen = []
    out = heldout_sequences(tgt, [[1, 2, 3]] * 40, 4, None, "chat", progress=lambda *e: seen.append(e))
    assert len(out) == 40 and all(len(h.ids) == 7 for h in out)
    # batches of similar length up to judge.GENERATE_MAX_BATCH (32) sequences: one event after each
    assert [(s, d, t) for s, d, t, _ in seen] == [("held-out continuations (chat, transformers)", n, 40) for n in (32, 40)]


def test_the_vllm_worker_reports_each_suite_while_it_runs(tmp_path):
    """The worker's progress lines (stderr) reach the caller as they come, and stay out of the error text."""
    import json
    import os

    from eagle_migrate.engines.vllm_engine import run_worker
    from eagle_migrate.engines.vllm_worker import PROGRESS_MARK, RESULT_MARK

    fake = tmp_path / "python"
    lines = [PROGRESS_MARK + json.dumps({"done": 0, "total": 2, "info": "loading the engine (target alone)"}),
             PROGRESS_MARK + json.dumps({"done": 1, "total": 2, "info": "chat: 4 prompts in 3 s"}),
             PROGRESS_MARK + json.dumps({"done": 2, "total": 2, "info": "long: 2 prompts in 9 s"})]
    fake.write_text("#!/bin/sh\ncat > /dev/null\n" + "".join(f"echo '{ln}' >&2\n" for ln in lines)
                    + f"echo '{RESULT_MARK}{json.dumps({'ok': True, 'runs': []})}'\n")
    os.chmod(fake, 0o755)
    seen = []
    res = run_worker({"suites": {}}, python=str(fake), progress=lambda *e: seen.append(e))
    assert res["ok"] and seen == [(0, 2, "loading the engine (target alone)"), (1, 2, "chat: 4 prompts in 3 s"),
                                  (2, 2, "long: 2 prompts in 9 s")]


def test_migrate_validate_stage_reports_its_engine_progress(tmp_path):
    """migrate's validate stage hands its StageProgress to the engine: request by request (reference engine), with a
    total, so the line has an ETA (it once printed 'validate 0 (1414 s) still running' for twenty minutes)."""
    from eagle_migrate import toy
    from eagle_migrate.migrate import MigrateOptions, migrate

    target, src = toy.write_target(tmp_path / "target"), toy.write_drafter(tmp_path / "src", "oracle")
    seen = []
    opts = MigrateOptions.of(calibrate=False, num_sequences=4, run_validate=True, engine="reference", suites="chat",
                             num_prompts=2, max_tokens=8)
    res = migrate(src, str(target), tmp_path / "run", opts, progress=lambda *e: seen.append(e))
    assert res.ok, res
    val = [(d, t) for s, d, t, *_ in seen if s == "validate: reference"]
    assert val and val[-1] == (4, 4) and [d for d, _ in val] == sorted(d for d, _ in val)  # 2 drafters x 2 prompts
