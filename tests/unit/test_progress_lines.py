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

    def fake_convert(**kw):
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
