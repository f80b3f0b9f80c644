"""`validate --server` on the real pair: SmolLM2-135M-Instruct served by a real vLLM server with an EAGLE-3 drafter,
against the in-process vLLM engine on the same prompts, within 2 standard errors (the server's, across blocks).

The drafter is $EAGLE_MIGRATE_TEST_SMOLLM2_DRAFTER when set, else the trained one in the asset cache
(benchmarks/train_smollm2_eagle3.py) when present, else a fresh
SmolLM2-shaped EAGLE-3 drafter initialised from the target (benchmarks/eagle3_scratch.py init_from_target: embeddings,
lm_head rows and final norm from the target, the rest random), whose AL is near 1: the engines still have to agree.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from eagle_migrate import assets

from .. import vllm_server
from ..conftest import requires_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm, requires_vllm]

SUITES = ["chat", "code"]
N, MAX_TOKENS, MML = 8, 64, 2048


def _drafter(tmp: Path, target_dir: Path) -> Path:
    chosen = os.environ.get("EAGLE_MIGRATE_TEST_SMOLLM2_DRAFTER")  # a SmolLM2 EAGLE-3 drafter in the vLLM layout
    if chosen:
        return Path(chosen)
    trained = assets.cache_root() / "smollm2-eagle3"
    if (trained / "config.json").exists():
        return trained
    import torch

    f = Path(__file__).resolve().parents[2] / "benchmarks" / "eagle3_scratch.py"
    if "eagle3_scratch" not in sys.modules:
        spec = importlib.util.spec_from_file_location("eagle3_scratch", f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["eagle3_scratch"] = mod
        spec.loader.exec_module(mod)
    es = sys.modules["eagle3_scratch"]
    from eagle_migrate.drafter import EagleDrafter
    from eagle_migrate.target import load_target

    target = load_target(str(target_dir), device="cpu", dtype=torch.float32)
    t_ids = torch.arange(1024) * 40
    m = EagleDrafter(es.smollm2_drafter_config(1024, norm_before_residual=True))
    es.init_from_target(m, target, t_ids, seed=0, std=0.05)
    out = tmp / "smollm2-eagle3-init"
    es.write_drafter(m, out, dtype=torch.float32, trained_by="tests/slow/test_validate_server_real.py (untrained)",
                     training={"steps": 0})
    return out


def test_server_agrees_with_in_process_engine_on_smollm2(tmp_path, capsys):
    from eagle_migrate.validate import validate
    from eagle_migrate.validate.api import validate_server

    target = assets.smollm2_target()
    drafter = _drafter(tmp_path, target)
    srv = vllm_server.start(target, tmp_path / "server.log", drafter=drafter, k=3, max_model_len=MML)
    try:
        rep = validate_server(drafter, str(target), srv.url, suites=SUITES, num_prompts=N, max_tokens=MAX_TOKENS,
                              block_size=2, report_dir=tmp_path / "server-report",
                              log=lambda m: print(m, file=sys.stderr))
    finally:
        vllm_server.stop(srv)
    assert rep.engine == "server" and rep.server.chat_template_matches is True
    inproc = validate(drafter, str(target), engine="vllm", suites=SUITES, num_prompts=N, max_tokens=MAX_TOKENS,
                      max_model_len=MML, diagnostics=False)
    for s, r in zip(rep.suites, inproc.suites):
        assert s.prompt_set["hash"] == r.prompt_set["hash"]  # the same prompts, paired
        se = s.new.acceptance_length_se
        diff = s.new.acceptance_length - r.new.acceptance_length
        print(f"{s.name}: server AL {s.new.acceptance_length:.4f} ± {se:.4f} ({s.new.num_blocks} blocks), in-process "
              f"{r.new.acceptance_length:.4f}, diff {diff:+.4f}", file=sys.stderr)
        assert se is not None and abs(diff) <= 2 * se + 1e-9, (s.name, diff, se)
