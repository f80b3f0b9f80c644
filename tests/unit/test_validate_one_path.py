"""`validate --server` and in-process validation share one code path: the same suites, per-suite results, gates and
report code (validate/api.py's run_validation) whichever registered engine measures; only the engine's session
differs. The server here is a fake vLLM (its /metrics through prometheus_client, every draft accepted)."""

from __future__ import annotations

import math

import pytest

from eagle_migrate import toy
from eagle_migrate.validate import api
from eagle_migrate.engines import server as srv

from .test_validate_server import FakeVllmMetrics

K = 3


class FakeServer:
    """A vLLM server as the server engine reads it: /health, /v1/models, /version, /metrics, /v1/completions; every
    request drafts ceil(n / (k + 1)) times and every draft is accepted (AL = k + 1)."""

    def __init__(self, url, api_key=None, *, root="target"):
        self.url, self.model, self.root = url, None, root
        self.m = FakeVllmMetrics(k=K)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def health(self):
        return None

    def models(self):
        return [{"id": "toy", "root": self.root, "max_model_len": 1024}]

    def version(self):
        return "0.32.0"

    def server_info(self):
        return {}

    def metrics(self):
        return srv.parse_metrics(self.m.text())

    def complete(self, prompt, max_tokens, **kw):
        drafts = math.ceil(max_tokens / (K + 1))
        self.m.serve(1, max_tokens, len(prompt), drafts=drafts, accepted_per_pos=[drafts] * K)
        return srv.Completion([1] * max_tokens, len(prompt), max_tokens)


@pytest.fixture
def pair(tmp_path):
    return toy.write_target(tmp_path / "target"), toy.write_drafter(tmp_path / "oracle", "oracle")


def test_server_and_in_process_go_through_the_same_suites_gates_and_report(pair, tmp_path, monkeypatch):
    target, drafter = pair
    calls: dict[str, list[str]] = {}

    def spy(name, fn):
        def wrapped(*a, **k):
            calls.setdefault(name, []).append(engine[0])
            return fn(*a, **k)
        monkeypatch.setattr(api, name, wrapped)

    engine = [""]
    for name in ("build_suites", "suite_result", "apply_gates", "overall", "write_report"):
        spy(name, getattr(api, name))
    monkeypatch.setattr(srv, "ServerClient", lambda url, key=None: FakeServer(url, key, root=str(target)))
    common = dict(suites=["chat"], num_prompts=2, max_tokens=8, min_acceptance_length=1.5)

    engine[0] = "reference"
    local = api.validate(drafter, str(target), engine="reference", diagnostics=False, report_dir=tmp_path / "local",
                         **common)
    engine[0] = "server"
    served = api.validate_server(drafter, str(target), "http://fake/v1", report_dir=tmp_path / "served", **common)

    assert {n: sorted(set(v)) for n, v in calls.items()} == {
        n: ["reference", "server"] for n in ("build_suites", "suite_result", "apply_gates", "overall", "write_report")}
    assert (local.engine, served.engine) == ("reference", "server")
    assert local.suites[0].prompt_set == served.suites[0].prompt_set  # the same suite, built by the same code
    assert local.suites[0].new.acceptance_length == served.suites[0].new.acceptance_length == K + 1
    assert [(g.name, g.passed) for g in local.gates] == [(g.name, g.passed) for g in served.gates] == \
        [("min_acceptance_length", True)]
    assert served.suites[0].new.num_blocks == 1 and served.server.vllm_version == "0.32.0"
    assert (tmp_path / "local" / "report.json").is_file() and (tmp_path / "served" / "report.json").is_file()
