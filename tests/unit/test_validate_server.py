"""The server engine's pieces without a server: /metrics parsing (vLLM's counters written by prometheus_client's own
exposition, read back by its parser), the refusals (no speculation, other names, other traffic), block standard
errors. The real server is exercised in tests/integration/test_validate_server_vllm.py."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from eagle_migrate.errors import ERROR_TABLE, InputError, ServerError
from eagle_migrate.engines import server as srv
from eagle_migrate.engines.metrics import AcceptanceStats, ratio_se


class FakeVllmMetrics:
    """The counters vLLM's PrometheusStatLogger registers (names, labels), on a private registry."""

    def __init__(self, k: int | None = 3, spec_names: tuple[str, ...] = tuple(srv.SPEC_COUNTERS)):
        self.reg = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.success = Counter("vllm:request_success", "done", lab + ["finished_reason"], registry=self.reg)
        self.gen = Counter("vllm:generation_tokens", "gen", lab, registry=self.reg)
        self.prompt = Counter("vllm:prompt_tokens", "prompt", lab, registry=self.reg)
        self.k = k
        if k is not None:
            self.spec = [Counter(n, n, lab, registry=self.reg) for n in spec_names]
            pos = Counter(srv.PER_POSITION, "pos", lab + ["position"], registry=self.reg)
            self.pos = [pos.labels("m", "0", str(i)) for i in range(k)]
            for c in self.spec:
                c.labels("m", "0")

    def serve(self, requests: int, gen: int, prompt: int, drafts: int = 0, accepted_per_pos: list[int] | None = None,
              reason: str = "length") -> None:
        self.success.labels("m", "0", reason).inc(requests)
        self.gen.labels("m", "0").inc(gen)
        self.prompt.labels("m", "0").inc(prompt)
        if self.k is not None:
            acc = accepted_per_pos or [0] * self.k
            for c, v in zip(self.spec, (drafts, drafts * self.k, sum(acc))):
                c.labels("m", "0").inc(v)
            for c, v in zip(self.pos, acc):
                c.inc(v)

    def text(self) -> str:
        return generate_latest(self.reg).decode()


def test_parse_sums_labels_and_reads_k_from_positions():
    m = FakeVllmMetrics(k=3)
    m.serve(2, 40, 30, drafts=10, accepted_per_pos=[9, 7, 5])
    m.serve(1, 8, 5, drafts=2, accepted_per_pos=[2, 2, 1], reason="stop")  # another finish reason: summed
    s = srv.parse_metrics(m.text())
    assert (s.requests, s.generation_tokens, s.prompt_tokens) == (3, 48, 35)
    assert s.spec == AcceptanceStats(num_drafts=12, num_draft_tokens=36, num_accepted_tokens=26,
                                     accepted_per_position=[11, 9, 6])
    assert s.num_positions == 3 and s.spec.acceptance_length == pytest.approx(1 + 26 / 12)
    srv.check_metric_names(s, "http://x/v1", "0.32.0")  # all names there: no refusal


def test_refusals_no_speculation_other_names_not_vllm():
    plain = srv.parse_metrics(FakeVllmMetrics(k=None).text())
    assert plain.spec is None
    with pytest.raises(ServerError, match="no speculative decoding configured") as e:
        srv.check_metric_names(plain, "http://x/v1", "0.32.0")
    assert "--speculative-config" in e.value.hint
    srv.check_metric_names(plain, "http://x/v1", None, speculative=False)  # a baseline server may lack them

    renamed = FakeVllmMetrics(k=3, spec_names=("vllm:spec_decode_drafts", "vllm:spec_decode_draft_tokens",
                                               "vllm:spec_decode_accepted_tokens"))
    with pytest.raises(ServerError, match="does not export the counters.*vllm:spec_decode_num_drafts"):
        srv.check_metric_names(srv.parse_metrics(renamed.text()), "http://x/v1", "9.9")
    with pytest.raises(ServerError, match="lists no vllm"):
        srv.check_metric_names(srv.parse_metrics("# TYPE other_total counter\nother_total 3\n"), "http://x/v1", None)
    assert ERROR_TABLE[ServerError][0] == 2  # bad input: exit 2


def _completion(n_out: int, n_prompt: int = 10) -> srv.Completion:
    return srv.Completion(list(range(n_out)), n_prompt, n_out)


def test_check_block_detects_other_traffic():
    m = FakeVllmMetrics(k=3)
    before = srv.parse_metrics(m.text())
    m.serve(2, 32, 20, drafts=8, accepted_per_pos=[8, 8, 8])
    after = srv.parse_metrics(m.text())
    d = srv.check_block(before, after, 2, [_completion(16), _completion(16)])
    assert d.acceptance_length == 4.0 and d.num_prompts == 2 and d.num_output_tokens == 32

    # someone else's request finished inside the block: the request count moved by more than was sent
    m.serve(2, 32, 20, drafts=8, accepted_per_pos=[8, 8, 8])
    m.serve(1, 5, 7, drafts=3, accepted_per_pos=[0, 0, 0])
    with pytest.raises(srv.OtherTraffic, match="vllm:request_success moved by 3, expected 2"):
        srv.check_block(after, srv.parse_metrics(m.text()), 2, [_completion(16), _completion(16)])
    # a request still running elsewhere generated tokens (no request finished): the token counts give it away
    b2 = srv.parse_metrics(m.text())
    m.serve(2, 32 + 9, 20, drafts=8 + 4, accepted_per_pos=[8, 8, 8])
    with pytest.raises(srv.OtherTraffic, match="vllm:generation_tokens moved by 41, expected 32"):
        srv.check_block(b2, srv.parse_metrics(m.text()), 2, [_completion(16), _completion(16)])


class FakeClient:
    """Scripted /metrics readings and completions (what measure() and settle() see of a server)."""

    def __init__(self, readings: list[str]):
        self.readings = list(readings)

    def metrics(self) -> srv.Scrape:
        text = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        return srv.parse_metrics(text)

    def complete(self, prompt, max_tokens, **kw) -> srv.Completion:
        return srv.Completion([1] * max_tokens, len(prompt), max_tokens)


def test_settle_waits_for_lagging_counters_and_refuses_overshoot():
    m = FakeVllmMetrics(k=3)
    t0 = m.text()
    m.serve(1, 4, 3, drafts=1, accepted_per_pos=[1, 1, 1])
    t1 = m.text()  # one of two requests recorded so far
    m.serve(1, 4, 3, drafts=1, accepted_per_pos=[1, 1, 1])
    t2 = m.text()
    m.serve(1, 4, 3, drafts=1, accepted_per_pos=[1, 1, 1])
    t3 = m.text()
    before = srv.parse_metrics(t0)
    assert srv.settle(FakeClient([t1, t2]), before, 2).requests == 2  # waited for the second one
    with pytest.raises(srv.OtherTraffic):
        srv.settle(FakeClient([t3]), before, 2)


def test_measure_blocks_and_standard_error():
    """Two blocks with different acceptance: the suite's AL is the pooled ratio, its SE the cluster SE."""
    m = FakeVllmMetrics(k=2)
    texts = [m.text()]
    m.serve(2, 8, 6, drafts=4, accepted_per_pos=[4, 4])  # block 1: AL 3
    texts.append(m.text())
    m.serve(2, 8, 6, drafts=8, accepted_per_pos=[0, 0])  # block 2: AL 1
    texts.append(m.text())
    fake = FakeClient([texts[0], texts[1], texts[2]])
    out = srv.measure(fake, {"chat": {"prompts": [[1, 2, 3]] * 4, "max_tokens": 4}}, block_size=2)
    stats, extra = out["chat"]
    assert stats.acceptance_length == pytest.approx(1 + 8 / 12) and len(extra["blocks"]) == 2
    se, pos = srv.block_errors(extra["blocks"])
    r = 8 / 12
    want = math.sqrt(2 * ((8 - r * 4) ** 2 + (0 - r * 8) ** 2)) / 12
    assert se == pytest.approx(want, abs=1e-4) and len(pos) == 2
    assert ratio_se([3, 3, 3], [1, 1, 1]) == 0.0 and ratio_se([1], [1]) is None


def test_urls_and_api_key(monkeypatch):
    assert srv._split_url("http://h:8000/v1/") == ("http://h:8000", "http://h:8000/v1")
    assert srv._split_url("http://h:8000") == ("http://h:8000", "http://h:8000/v1")
    assert srv._split_url("https://gw.example/llm/v1") == ("https://gw.example/llm", "https://gw.example/llm/v1")
    with pytest.raises(InputError):
        srv._split_url("h:8000")
    monkeypatch.delenv("EM_TEST_KEY", raising=False)
    with pytest.raises(InputError, match="EM_TEST_KEY"):
        srv.api_key_from_env("EM_TEST_KEY")
    monkeypatch.setenv("EM_TEST_KEY", "s3cr3t-value")
    assert srv.api_key_from_env("EM_TEST_KEY") == "s3cr3t-value"
    c = srv.ServerClient("http://user:pw@127.0.0.1:9/v1", "s3cr3t-value")
    assert "pw" not in c.url and "s3cr3t" not in c.url
    c.close()


def test_unreachable_server_is_one_line_exit_2():
    from tests.vllm_server import free_port

    port = free_port()  # nothing listens there
    with srv.ServerClient(f"http://127.0.0.1:{port}/v1", "s3cr3t-value") as c:
        with pytest.raises(ServerError, match="cannot reach the server") as e:
            srv.describe(c)
    assert "s3cr3t" not in str(e.value) and "/health" in e.value.hint


def _speed_report():
    from eagle_migrate.validate.report import (LatencyStats, LoadRun, Metrics, ServerInfo, ServingSpeed, SpeedLevel,
                                               SuiteResult, ValidationReport)

    lat = LatencyStats(p50=10.0, p90=12.0, p99=15.0, mean=10.5)

    def run(tps):
        return LoadRun(requests=4, output_tokens=64, seconds=1.0, per_user_tokens_per_second=tps,
                       output_tokens_per_second=tps * 2, ttft_ms=lat, itl_ms=lat, tpot_ms=lat)

    levels = [SpeedLevel(concurrency=c, rounds=2, speculative=[run(30.0), run(33.0)], baseline=[run(20.0), run(20.0)],
                         ratios=[1.5, 1.65], speedup=1.575, speedup_min=1.5, speedup_max=1.65, speedup_se=0.075)
              for c in (1, 16)]
    stats = AcceptanceStats(num_drafts=4, num_draft_tokens=12, num_accepted_tokens=6, accepted_per_position=[3, 2, 1],
                            num_prompts=2, num_output_tokens=10)
    m = Metrics.from_stats(stats, 1.0)
    m.acceptance_length_se, m.num_blocks = 0.25, 2
    suite = SuiteResult(name="chat", description="d", prompt_set={"size": 2}, new=m)
    return ValidationReport(tool="t", created="now", checkpoint="ORG/drafter", baseline=None, target="t",
                            engine="server", engine_version="0.32.0", settings={"num_speculative_tokens": 3},
                            suites=[suite], server=ServerInfo(url="http://h/v1", vllm_version="0.32.0", model="m",
                                                              speculative_config={"num_speculative_tokens": 3},
                                                              sources={"num_speculative_tokens": "metrics"}),
                            serving_speed=ServingSpeed(baseline_url="http://b/v1", max_tokens=16, levels=levels))


def test_report_and_card_show_the_serving_speedup(tmp_path):
    from eagle_migrate.publish.card import CardInfo, render_body
    from eagle_migrate.publish.report import load_report
    from eagle_migrate.validate.report import write_report

    files = write_report(_speed_report(), tmp_path)
    assert "speedup.png" in files and (tmp_path / "speedup.png").stat().st_size > 0
    md = (tmp_path / "report.md").read_text()
    assert "## Serving speed-up" in md and "| 16 | 31.5 | 20.0 | 1.575x | 1.500-1.650 |" in md
    assert "chat AL 2.500 ± 0.250 (2 blocks)" in md and "num_speculative_tokens=3 (from metrics)" in md
    info = load_report(tmp_path).info
    row = dict(info.details)
    key = next(k for k in row if k.startswith("serving speed-up"))
    assert row[key] == "C=1 1.57x (1.50-1.65), C=16 1.57x (1.50-1.65)"
    body = render_body(CardInfo(repo_id="o/r", tool_version="x", validation=info))
    assert "C=16 1.57x (1.50-1.65)" in body
