"""The triage (validate --server URL --prompts FILE --triage) against a recorded-behaviour fake vLLM server: its
/metrics written by prometheus_client as vLLM's logger writes them, its per-request metrics.speculative_decoding as
vLLM 0.32's completion serving returns them (RequestSpecDecodeMetrics.to_dict's keys), and acceptance that falls on
long prompts. The live server: tests/integration/test_triage_vllm.py."""

from __future__ import annotations

import json
import threading

import pytest

from eagle_migrate import corpora
from eagle_migrate.errors import EngineError, InputError, ServerError
from eagle_migrate.validate import server_replay, triage
from eagle_migrate.engines.metrics import ratio_se
from eagle_migrate.engines.options import ValidateOptions
from eagle_migrate.engines.server_client import Completion, parse_metrics
from eagle_migrate.engines.server_tokenizer import ServedModel, ServerTokenizer

from .test_validate_server import FakeVllmMetrics

K = 3
LONG = 40  # prompts of more tokens than this draft worse in the fake


class FakeServer:
    """A vLLM server as the triage sees it: words are tokens, a draft accepts 3 tokens on a short prompt and 1 on a
    long one (one draft in four a token less, varying by prompt: a nonzero SE), counters in /metrics."""

    url = "http://fake:8000/v1"

    def __init__(self, per_request: bool = True, chat_template: bool = True, tokenizer: bool = True,
                 spec: bool = True, drop_after: int | None = None, max_model_len: int = 4096, other_traffic: bool = False,
                 long_accept: int = 1):
        self.long_accept = long_accept  # tokens a draft accepts on a long prompt (3 after a recalibration: AL ~4)
        self.m = FakeVllmMetrics(k=K if spec else None)
        self.per_request, self.chat_template, self.tokenizer = per_request, chat_template, tokenizer
        self.drop_after, self.max_model_len, self.other_traffic = drop_after, max_model_len, other_traffic
        self.sent: list[list[int]] = []
        self.returned: dict[tuple[int, ...], dict] = {}
        self.lock = threading.Lock()
        self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def close(self):
        pass

    def health(self):
        pass

    def models(self):
        return [{"id": "toy", "root": "/models/toy", "max_model_len": self.max_model_len}]

    def version(self):
        return "0.32.0"

    def server_info(self):
        return None

    def metrics(self):
        return parse_metrics(self.m.text())

    def _check_tok(self):
        if not self.tokenizer:
            raise EngineError(f"{self.url}: HTTP 400 on POST /tokenize: tokenizer not initialized")

    def tokenize_text(self, text, add_special_tokens=False):
        self._check_tok()
        return ([1] if add_special_tokens else []) + [2 + sum(map(ord, w)) % 500 for w in text.split()]

    def tokenize_messages(self, messages, add_generation_prompt=True):
        self._check_tok()
        if not self.chat_template:
            raise EngineError(f"{self.url}: HTTP 400 on POST /tokenize: As of transformers v4.44, default chat "
                              "template is no longer allowed, so you must provide a chat template if the tokenizer "
                              "does not define one.")
        ids = [1]
        for m in messages:
            ids += [600 if m["role"] == "system" else 601] + self.tokenize_text(m["content"])
        return ids + [602]

    def complete(self, prompt, max_tokens, *, temperature=0.0, seed=0, ignore_eos=False):
        ids = list(prompt)
        with self.lock:
            if self.drop_after is not None and len(self.sent) >= self.drop_after:
                raise ServerError(f"cannot reach the server at {self.url} (ConnectError: connection refused)",
                                  "check that the server is up")
            self.sent.append(ids)
        base = self.long_accept if len(ids) > LONG else 3
        hist, out = [0] * (K + 1), 0
        i = 0
        while out < max_tokens:
            j = base - 1 if (i + sum(ids)) % 4 == 0 else base
            hist[j] += 1
            out += j + 1
            i += 1
        drafts, acc = sum(hist), sum(j * c for j, c in enumerate(hist))
        per_pos = [sum(c for j, c in enumerate(hist) if j > p) for p in range(K)]
        with self.lock:
            self.m.serve(1, out, len(ids), drafts=drafts, accepted_per_pos=per_pos)
            if self.other_traffic:  # someone else's request finishes meanwhile
                self.m.serve(1, 8, 5, drafts=4, accepted_per_pos=[4, 4, 4])
        spec = {"mean_acceptance_length": 1 + acc / drafts, "draft_acceptance_rate": acc / (drafts * K),
                "acceptance_histogram": hist, "num_spec_steps": drafts, "num_accepted_draft_tokens": acc,
                "num_draft_tokens": drafts * K, "num_spec_tokens": K}
        self.returned[tuple(ids)] = spec
        return Completion(list(range(out)), len(ids), out, spec if self.per_request else None)


def _traffic(path, n_short=6, n_long=4, extra=()):
    rows = []
    for i in range(n_short):
        rows.append({"prompt": f"Tell me about the sea and the wind number {i}"})
    for i in range(n_long):
        rows.append({"messages": [{"role": "system", "content": "You are terse."},
                                  {"role": "user", "content": " ".join(f"w{i}x{j}" for j in range(60))}]})
    rows += list(extra)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(monkeypatch, fake, path, **kw):
    monkeypatch.setattr(server_replay, "ServerClient", lambda url, key=None, **k: fake)
    logs: list[str] = []
    opts = ValidateOptions.of(server="http://fake:8000/v1", prompts_file=path, triage=True, max_tokens=24,
                              concurrency="3", **kw)
    return server_replay.triage_server(opts, log=logs.append), logs


def test_per_request_metrics_group_and_name_the_long_prompts(monkeypatch, tmp_path):
    fake = FakeServer()
    r, logs = _run(monkeypatch, fake, _traffic(tmp_path / "t.jsonl"))
    assert r.per_request == "response" and r.complete and r.error is None and len(r.requests) == 10
    assert not any("one at a time" in m for m in logs)
    for q in r.requests:  # each request's counters are what the server returned for its prompt
        sent = [s for s in fake.sent if fake.returned[tuple(s)]["num_spec_steps"] == q.num_drafts]
        assert sent and q.source == "response"
        assert q.acceptance_length == pytest.approx(1 + q.num_accepted_tokens / q.num_drafts)
        assert sum(q.histogram) == q.num_drafts
    lens = {q.line: q.prompt_tokens for q in r.requests}
    assert all(lens[ln] > LONG for ln in range(7, 11)) and all(lens[ln] <= LONG for ln in range(1, 7))
    # the pool and each group: sums of the requests' counters, SE across requests
    d = [q.num_drafts for q in r.requests]
    a = [q.num_accepted_tokens for q in r.requests]
    assert r.pooled.acceptance_length == pytest.approx(1 + sum(a) / sum(d))
    assert r.pooled.se == pytest.approx(ratio_se(a, d))
    assert r.metrics_check["equal"] and r.metrics_check["per_request_sum"]["num_drafts"] == sum(d)
    below = [g for g in r.groups if g.below]
    names = {(g.feature, g.name) for g in below}
    assert ("template", "chat template") in names and any(f == "system" and n.startswith("system prompt") for f, n in names)
    # the two groups are the same four requests: one is named, the other explained by it (a confound)
    assert len([g for g in below if g.named]) == 1 and len(r.below) == 1
    other = [g for g in below if not g.named][0]
    assert other.explained_by == next(f"{g.feature}: {g.name}" for g in below if g.named) and "explained by" in other.text
    long_group = [g for g in r.groups if g.feature == "system" and g.below][0]
    members = [q for q in r.requests if q.system is not None]
    assert {q.line for q in members} == {7, 8, 9, 10} and long_group.requests == 4
    assert long_group.acceptance_length < r.pooled.acceptance_length < long_group.rest_acceptance_length
    assert all(g.text.startswith(g.name + ": AL ") and "pooled" in g.text for g in r.groups)
    assert not any(g.below for g in r.groups if g.name in ("plain prompt", "no system prompt"))


def test_without_per_request_metrics_one_at_a_time_gives_the_same_counters(monkeypatch, tmp_path):
    path = _traffic(tmp_path / "t.jsonl")
    with_, _ = _run(monkeypatch, FakeServer(per_request=True), path)
    without, logs = _run(monkeypatch, FakeServer(per_request=False), path)
    assert without.per_request == "metrics" and without.concurrency == 1
    assert sum("no per-request spec-decode metrics" in m for m in logs) == 1
    key = lambda r: {q.line: (q.num_drafts, q.num_accepted_tokens, q.histogram, q.acceptance_length)  # noqa: E731
                     for q in r.requests}
    assert key(without) == key(with_)  # the histogram from /metrics' per-position counters equals the server's
    assert {g.name for g in without.groups if g.below} == {g.name for g in with_.groups if g.below}


def test_other_traffic_does_not_stop_per_request_metrics_but_is_said(monkeypatch, tmp_path):
    path = _traffic(tmp_path / "t.jsonl")
    r, logs = _run(monkeypatch, FakeServer(other_traffic=True), path)
    assert r.complete and r.per_request == "response" and len(r.requests) == 10
    assert r.metrics_check["equal"] is False and any("other traffic" in m for m in logs)
    r2, _ = _run(monkeypatch, FakeServer(other_traffic=True, per_request=False), path)  # /metrics differences: refused
    assert not r2.complete and "other traffic" in r2.error and r2.requests == []


def test_worst_file_is_convert_data_and_the_heldout_part_never_overlaps(monkeypatch, tmp_path):
    dup = {"prompt": "Tell me about the sea and the wind number 0"}  # the same prompt twice in the traffic
    path = _traffic(tmp_path / "t.jsonl", extra=[dup])
    out = tmp_path / "worst.jsonl"
    r, _ = _run(monkeypatch, FakeServer(), path, worst=(2, out), report_dir=tmp_path / "rep")
    assert json.loads((tmp_path / "rep" / "triage.json").read_text())["worst"]["file"] == str(out)
    w = r.worst
    held = tmp_path / "worst.heldout.jsonl"
    assert w.file == str(out) and w.heldout_file == str(held)
    train = corpora.load_conversations(out)  # what convert --data reads
    test = corpora.load_conversations(held)
    assert len(train) == w.records and len(test) == w.heldout_records and w.heldout_records >= 1
    key = lambda c: json.dumps([c.messages, c.token_ids])  # noqa: E731
    assert not {key(c) for c in train} & {key(c) for c in test}
    chosen = {json.loads(x)["id"] for f in (out, held) for x in f.read_text().splitlines()}
    lowest = sorted(r.requests, key=lambda q: (q.acceptance_length, q.index))[:2]
    assert {q.id for q in lowest} <= chosen
    below = [g for g in r.groups if g.named]
    for g in below:  # every request of a group below the pool is in one of the two files
        assert {q.id for q in r.requests if q.feature(g.feature) == g.name} <= chosen
    assert all(c.shape == "messages" and c.messages[0]["role"] == "system" for c in train + test
               if len(c.text.split()) > LONG)
    assert path.read_text().count("\n") == 11  # the input untouched
    with pytest.raises(InputError, match="--worst"):
        _run(monkeypatch, FakeServer(), path, worst=(2, path))  # never over an input


def test_a_line_numbers_survive_blank_lines_and_reach_the_report(monkeypatch, tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('\n{"prompt": "one two"}\n\n{"prompt": "three four five"}\n')
    assert [c.line for c in corpora.load_conversations(p)] == [2, 4]
    r, _ = _run(monkeypatch, FakeServer(), p)
    assert sorted(q.line for q in r.requests) == [2, 4]


def test_a_model_without_chat_template_gets_plain_transcripts(monkeypatch, tmp_path):
    fake = FakeServer(chat_template=False)
    r, logs = _run(monkeypatch, fake, _traffic(tmp_path / "t.jsonl"))
    assert r.complete and len(r.requests) == 10
    assert sum("no chat template" in m for m in logs) == 1
    assert {q.template for q in r.requests if q.system} == {"plain transcript (no chat template)"}
    assert not any(600 in s or 601 in s for s in fake.sent)  # no chat-template tokens sent


def test_validate_server_suites_without_chat_template_render_plain(monkeypatch):
    """validate --server URL alone on a base model: /tokenize refuses messages, the suites render chats as plain
    transcripts (corpora's plain template) instead of stopping with a DataError."""
    fake = FakeServer(chat_template=False)
    st = ServerTokenizer(fake)
    assert st.chat_template is None and "default chat template" in st.chat_refused
    s = corpora.suite("chat", st, ServedModel(4096), num_prompts=2, max_tokens=16, max_model_len=4096, fetch=False)
    conv = corpora.load_conversations(None)[0]
    text = corpora.render_text(conv, None, "plain")
    assert s.prompts and all(600 not in p and 601 not in p for p in s.prompts)
    assert fake.tokenize_text(text) in [p[-len(fake.tokenize_text(text)):] for p in s.prompts] or s.prompts
    assert ServerTokenizer(FakeServer()).chat_template  # a model with a template keeps the server's


def test_too_long_prompt_names_its_line_before_any_request(monkeypatch, tmp_path):
    fake = FakeServer(max_model_len=80)
    with pytest.raises(InputError, match=r"line 7: the prompt has \d+ tokens.*context of 80 tokens \(and 3 more: "
                                         r"lines 8, 9, 10\)"):
        _run(monkeypatch, fake, _traffic(tmp_path / "t.jsonl"))
    assert fake.sent == []


def test_server_without_speculation_or_tokenizer_is_refused(monkeypatch, tmp_path):
    path = _traffic(tmp_path / "t.jsonl")
    with pytest.raises(ServerError, match="no speculative decoding"):
        _run(monkeypatch, FakeServer(spec=False), path)
    with pytest.raises(ServerError, match="line 1: the server cannot tokenise"):
        _run(monkeypatch, FakeServer(tokenizer=False), path)
    ids = tmp_path / "ids.jsonl"  # token ids need no tokenizer
    ids.write_text("".join(json.dumps({"token_ids": list(range(1, n))}) + "\n" for n in (5, 6, 50, 60)))
    r, _ = _run(monkeypatch, FakeServer(tokenizer=False), ids)
    assert r.complete and {q.kind for q in r.requests} == {"token ids (no text)"}


@pytest.mark.parametrize("per_request", [True, False])
def test_a_server_that_drops_mid_run_keeps_what_was_measured(monkeypatch, tmp_path, per_request):
    r, logs = _run(monkeypatch, FakeServer(per_request=per_request, drop_after=5), _traffic(tmp_path / "t.jsonl"))
    assert not r.complete and "stopped after 5 of 10" in r.error and "cannot reach" in r.error
    assert len(r.requests) == 5 and r.pooled.requests == 5 and r.pooled.acceptance_length is not None
    assert any(m.startswith("warning: the replay stopped") for m in logs)


def test_cli_triage_json_one_document_and_the_drop_exit_code(monkeypatch, tmp_path, capsys):
    from eagle_migrate.cli import main

    path = _traffic(tmp_path / "t.jsonl")
    monkeypatch.setattr(server_replay, "ServerClient", lambda url, key=None, **k: FakeServer())
    with pytest.raises(SystemExit) as e:
        main(["validate", "--server", "http://fake:8000/v1", "--prompts", str(path), "--triage", "--json",
              "--max-tokens", "24", "--worst", "3", str(tmp_path / "w.jsonl")])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert e.value.code in (0, None) and doc["per_request"] == "response" and doc["worst"]["records"] >= 1
    assert doc["below"] and "triage:" in err
    monkeypatch.setattr(server_replay, "ServerClient", lambda url, key=None, **k: FakeServer(drop_after=3))
    with pytest.raises(SystemExit) as e:
        main(["validate", "--server", "http://fake:8000/v1", "--prompts", str(path), "--triage", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one document: the partial report; the error on stderr
    assert e.value.code == 2 and len(doc["requests"]) == 3 and "stopped after 3 of 10" in err
    with pytest.raises(SystemExit) as e:
        main(["validate", "--prompts", str(path), "--triage"])
    assert e.value.code == 2 and "need --server URL" in capsys.readouterr().err


@pytest.mark.parametrize("text,kind", [
    ("def add(a, b):\n    return a + b\n", "code"),
    ("Fix this:\n```python\nx = 1\n```", "code"),
    ("Please explain how the tides work and why the moon matters.", "prose"),
    ("Расскажи мне, пожалуйста, о море и ветре.", "language: cyrillic"),
    ("Explica por qué el cielo es azul durante el día y rojo al atardecer, por favor.",
     "language: other (latin script)"),
    ("请解释一下为什么天空是蓝色的", "language: cjk"),
])
def test_kind_heuristic(text, kind):
    assert triage.kind_of(text) == kind


def test_a_confounded_group_is_explained_not_named():
    """Long prompts lose acceptance; most long prompts are also plain prompts, so plain prompts are below the pool
    too, but not once the long ones are set aside: named is the length group, the template one is explained."""
    reqs = []
    for i in range(40):
        long_ = i < 12
        plain = long_ and i < 10 or (not long_ and i % 4 == 0)
        reqs.append(triage.TriagedRequest(index=i, line=i + 1, template="plain prompt" if plain else "chat template",
                                          length="prompts over 8k tokens" if long_ else "prompts under 512 tokens",
                                          kind="prose", num_drafts=10, num_accepted_tokens=(10 if long_ else 28) + i % 3,
                                          acceptance_length=1.0))
    _, groups = triage.group_requests(reqs)
    by = {g.name: g for g in groups}
    assert by["prompts over 8k tokens"].named and by["plain prompt"].below and not by["plain prompt"].named
    assert by["plain prompt"].explained_by == "length: prompts over 8k tokens"
    assert groups[0].name == "prompts over 8k tokens"


def test_groups_equal_to_the_pool_are_not_below_and_histogram_from_counters():
    reqs = [triage.TriagedRequest(index=i, line=i + 1, template="plain prompt", kind="prose" if i % 2 else "code",
                                  num_drafts=10, num_accepted_tokens=20 + (i % 3), acceptance_length=3.0 + (i % 3) / 10)
            for i in range(12)]
    pooled, groups = triage.group_requests(reqs)
    assert pooled.requests == 12 and not any(g.below for g in groups)
    assert {g.feature for g in groups} == {"kind"}  # one-valued features are not groups
    assert triage.histogram_of(10, [8, 5, 2], 3) == [2, 3, 3, 2]
    assert triage.heldout_path(tmp := "x/worst.jsonl") != tmp and str(triage.heldout_path(tmp)).endswith("worst.heldout.jsonl")


# ----- watch --responses: the per-request histogram of each window ------------------------------------------------
def _spec(hist: list[int]) -> dict:
    d = sum(hist)
    acc = sum(j * c for j, c in enumerate(hist))
    return {"mean_acceptance_length": 1 + acc / d if d else 1.0, "acceptance_histogram": hist, "num_spec_steps": d,
            "num_accepted_draft_tokens": acc, "num_draft_tokens": 3 * d, "num_spec_tokens": 3}


def test_watch_counts_each_windows_requests_below_the_floor(tmp_path):
    from .test_watch import Replica, World, steady

    log = tmp_path / "responses.jsonl"
    log.write_text(json.dumps({"metrics": {"speculative_decoding": _spec([0, 0, 0, 9])}}) + "\n")  # before: not counted
    w = World(a=Replica())
    steady(w, "a", 1.0, 12.0, requests=1, drafts=8, per_pos=[8, 4, 0])

    def append(lines: list[str]) -> None:
        with open(log, "a") as f:
            f.write("".join(lines))

    # window 1: three responses (AL 4, 4, 1.5), a line without metrics; window 2: one response (AL 2) and half a line
    w.at(2.0, lambda: append([json.dumps({"id": "a", "metrics": {"speculative_decoding": _spec([0, 0, 0, 5])}}) + "\n",
                              json.dumps({"speculative_decoding": _spec([0, 0, 0, 4])}) + "\n",
                              json.dumps(_spec([1, 1, 0, 0])) + "\n", "{\"choices\": []}\n"]))
    w.at(8.0, lambda: append([json.dumps(_spec([0, 6, 0, 0])) + "\n", "{\"metrics\": {\"specul"]))
    res, wins = w.run(window=6.0, scrape_every=1.0, duration=12.0, min_al=2.5, responses=log)
    p1, p2 = wins[0].per_request, wins[1].per_request
    assert (p1.requests, p1.below_floor, p1.skipped_lines) == (3, 1, 1)
    assert p1.al_histogram["1.5-2"] == 1 and p1.al_histogram["3.5-4"] == 2 and sum(p1.al_histogram.values()) == 3
    assert p1.acceptance_histogram == [1, 1, 0, 9]
    assert (p2.requests, p2.below_floor, p2.al_histogram["2-2.5"]) == (1, 1, 1)  # the half line waits


def test_watch_responses_file_must_exist(tmp_path):
    from .test_watch import Replica, World

    with pytest.raises(InputError, match="--responses"):
        World(a=Replica()).run(window=6.0, duration=6.0, responses=tmp_path / "nope.jsonl")


def test_tenant_is_a_feature_when_the_file_has_one(monkeypatch, tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"prompt": f"tell me about the sea number {i}", "tenant": "acme" if i % 2 else "globex"} for i in range(6)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [c.tenant for c in corpora.load_conversations(p)] == ["globex", "acme"] * 3
    r, _ = _run(monkeypatch, FakeServer(), p)
    tenants = {g.name: g.requests for g in r.groups if g.feature == "tenant"}
    assert tenants == {"acme": 3, "globex": 3} and not r.below


def test_triage_refuses_the_suite_options_it_would_ignore():
    from eagle_migrate.engines.options import ValidateOptions

    for extra in ({"suites": "chat"}, {"baseline_server": "http://b"}):
        with pytest.raises(InputError, match="--suite and --baseline-server do not apply"):
            ValidateOptions.of(server="http://s", prompts_file="p.jsonl", triage=True, **extra)
    assert ValidateOptions.of(server="http://s", prompts_file="p.jsonl", triage=True).triage
