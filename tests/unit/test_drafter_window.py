"""Sliding-window draft layers in drafter/model.py: a layer with ``layer_types[i] == "sliding_attention"`` and window W
lets a query at position q see keys q-W+1..q (vLLM's backends run window (W-1, 0)), in step 0 and in the cached draft
steps; full layers and sequences no longer than W are unchanged. (vLLM itself: tests/integration/test_sliding_window_vllm.py.)"""

from __future__ import annotations

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import DrafterConfig
from eagle_migrate.drafter.config import attention_windows_of
from eagle_migrate.drafter.model import EagleDrafter, KVCache
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.formats.write import write_vllm

H, V = 32, 48


def _cfg(**kw) -> DrafterConfig:
    return DrafterConfig(hidden_size=H, target_hidden_size=H, num_aux=3, vocab_size=V, draft_vocab_size=V,
                         intermediate_size=2 * H, num_attention_heads=2, num_key_value_heads=1, head_dim=16, **kw)


def _pair(w: int, **kw) -> tuple[EagleDrafter, EagleDrafter]:
    """The same random weights with the window (every layer sliding unless layer_types says otherwise) and without."""
    layers = kw.pop("num_layers", 1)
    types = kw.pop("layer_types", ["sliding_attention"] * layers)
    torch.manual_seed(0)
    win = EagleDrafter(_cfg(num_layers=layers, layer_types=types, sliding_window=w, **kw))
    with torch.no_grad():  # attention far from uniform, so which keys a query sees shows in its output
        for layer in win.layers:
            layer.self_attn.q_proj.weight.mul_(2.0)
            layer.self_attn.k_proj.weight.mul_(2.0)
        win.lm_head.weight.mul_(20.0)
    full = EagleDrafter(_cfg(num_layers=layers, **kw))
    full.load_state_dict(win.state_dict())
    return win.eval(), full.eval()


def _inputs(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (1, n + 1), generator=g), torch.randn(1, n, 3 * H, generator=g)


def test_config_validates_the_window():
    assert _cfg(num_layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=4).layer_window(1) == 4
    assert _cfg(num_layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=4).layer_window(0) is None
    assert _cfg().layer_window(0) is None
    with pytest.raises(ValueError, match="layer_types has 1 entries but num_layers=2"):
        _cfg(num_layers=2, layer_types=["sliding_attention"], sliding_window=4)
    with pytest.raises(ValueError, match="only full_attention, sliding_attention"):
        _cfg(layer_types=["chunked_attention"], sliding_window=4)
    with pytest.raises(ValueError, match="set together"):
        _cfg(layer_types=["sliding_attention"])
    with pytest.raises(ValueError):
        _cfg(layer_types=["sliding_attention"], sliding_window=0)


def test_masks_by_hand():
    """W = 3: step 0 over 5 positions, then one cached draft step at index 5; only the sliding layer (1) is cut."""
    m, _ = _pair(3, num_layers=2, layer_types=["full_attention", "sliding_attention"])
    full0, win0 = m._masks(5, 0, 0, False, torch.device("cpu"))
    t, f = True, False
    assert torch.equal(full0[0, 0], torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    assert win0[0, 0].tolist() == [[t, f, f, f, f],
                                   [t, t, f, f, f],
                                   [t, t, t, f, f],
                                   [f, t, t, t, f],
                                   [f, f, t, t, t]]
    full1, win1 = m._masks(1, 5, 0, False, torch.device("cpu"))  # a draft step: one query, 5 cached keys
    assert full1 is None  # every key
    assert win1[0, 0].tolist() == [[f, f, f, t, t, t]]
    # no longer than the window: nothing hidden, the plain causal mask (or none)
    assert m._masks(1, 2, 0, False, torch.device("cpu")) == [None, None]
    c = m._masks(3, 0, 0, False, torch.device("cpu"))
    assert torch.equal(c[0], c[1])


def test_window_changes_nothing_within_it():
    win, full = _pair(16, num_layers=2)
    ids, aux = _inputs(12)  # 12 context positions + 3 draft steps = 15 keys at most < 16
    cw, cf = KVCache(), KVCache()
    dw, ow = win.draft_with_cache(ids, aux, 4, cw)
    df, of = full.draft_with_cache(ids, aux, 4, cf)
    assert torch.equal(dw, df)
    for a, b in zip(ow, of):
        assert torch.equal(a.h_post, b.h_post)


def test_step0_differs_exactly_where_the_window_cuts():
    w, n = 8, 30
    win, full = _pair(w)
    ids, aux = _inputs(n)
    g = win.combine(aux)
    pos = torch.arange(n).unsqueeze(0)
    hw = win.forward_step(ids[:, 1:], g, pos).h_post[0]
    hf = full.forward_step(ids[:, 1:], g, pos).h_post[0]
    diff = (hw - hf).abs().amax(-1)
    assert torch.equal(hw[:w], hf[:w])  # query i < W sees keys 0..i either way
    assert (diff[w:] > 0).all() and (diff[w:] > 1e-2).float().mean() > 0.5, diff  # query i >= W loses keys 0..i-W


def test_draft_steps_see_only_the_last_w_cached_keys():
    """A draft step over a cache of 30 positions: on the sliding layer the keys before q-W+1 must not matter
    (overwriting them changes nothing); they do matter without the window. And the drafts differ from the
    full-attention drafter's somewhere on long contexts."""
    w, n = 8, 30
    for model, must_ignore in zip(_pair(w), (True, False)):
        ids, aux = _inputs(n)
        cache = KVCache()
        _, outs = model.draft_with_cache(ids, aux, 1, cache)
        feed = outs[0].h_feed[:, -1:]
        tok, p = torch.tensor([[5]]), torch.tensor([[n]])
        ref = model.forward_step(tok, feed, p, cache=KVCache(list(cache.keys), list(cache.values))).h_post
        k, v = cache.keys[0].clone(), cache.values[0].clone()
        cut = n - w + 1  # the query at index n sees keys n-W+1..n: indices 0..n-W are outside
        k[:, :, :cut] = torch.randn_like(k[:, :, :cut]) * 10
        v[:, :, :cut] = torch.randn_like(v[:, :, :cut]) * 10
        got = model.forward_step(tok, feed, p, cache=KVCache([k], [v])).h_post
        assert torch.equal(got, ref) if must_ignore else not torch.allclose(got, ref, atol=1e-4)
        k2, v2 = cache.keys[0].clone(), cache.values[0].clone()
        k2[:, :, cut] = torch.randn_like(k2[:, :, cut]) * 10  # the oldest key inside the window does count
        v2[:, :, cut] = torch.randn_like(v2[:, :, cut]) * 10
        assert not torch.allclose(model.forward_step(tok, feed, p, cache=KVCache([k2], [v2])).h_post, ref, atol=1e-4)
    win, full = _pair(w)
    differs = 0
    for seed in range(6):
        ids, aux = _inputs(n, seed)
        differs += not torch.equal(win.draft(ids, aux, 3), full.draft(ids, aux, 3))
    assert differs


def test_attention_windows_as_vllm_reads_them():
    """attention_windows_of: vLLM 0.32's reading per family (llama.py / qwen3_eagle3.py + Qwen3Config; DeepSeek: none)."""
    sw = {"layer_types": ["sliding_attention"], "sliding_window": 8}
    assert attention_windows_of(sw, "llama", 1) == (["sliding_attention"], 8, None)
    assert attention_windows_of({**sw, "use_sliding_window": False}, "llama", 1)[:2] == (["sliding_attention"], 8)
    assert attention_windows_of(sw, "qwen3", 1)[:2] == (None, None)  # Qwen3Config: no use_sliding_window, no window
    assert attention_windows_of({**sw, "use_sliding_window": True}, "qwen3", 1)[:2] == (["sliding_attention"], 8)
    # Qwen3 without layer_types: layers from max_window_layers on slide
    q = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
    assert attention_windows_of(q, "qwen3", 2)[:2] == (["full_attention", "sliding_attention"], 8)
    assert attention_windows_of({**q, "max_window_layers": 28}, "qwen3", 2)[:2] == (None, None)
    assert attention_windows_of({**sw, "sliding_window": 0}, "llama", 1)[:2] == (None, None)  # 0: vLLM disables it
    types, window, problem = attention_windows_of(sw, "llama", 2)  # vLLM's assert on a short list
    assert (types, window) == (None, None) and "fails to load" in problem
    assert "ignores" in attention_windows_of(sw, "mla", 1)[2]


def test_vllm_layout_round_trip_and_mixed_layers(tmp_path):
    """The vLLM writer writes the window and the reader reads it back; a drafter mixing full and sliding layers is
    carried but reported as an error (vLLM 0.32 refuses to load it)."""
    cfg = toy.drafter_config(layer_types=["sliding_attention"], sliding_window=8)
    sd = toy.drafter_state_dict()
    (tmp_path / "one").mkdir()
    write_vllm(cfg, sd, tmp_path / "one", dtype=torch.float32)
    ck = read_checkpoint(tmp_path / "one")
    assert (ck.config.layer_types, ck.config.sliding_window) == (["sliding_attention"], 8)
    assert [f.severity for f in ck.findings if f.code == "sliding_window"] == ["info"]
    two = dict(sd)
    for k, v in sd.items():
        if k.startswith("layers.0.") and "hidden_norm" not in k:
            two[k.replace("layers.0.", "layers.1.")] = v[:, : v.shape[1] // 2] if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) else v
    cfg2 = cfg.model_copy(update={"num_layers": 2, "layer_types": ["full_attention", "sliding_attention"]})
    (tmp_path / "mixed").mkdir()
    write_vllm(cfg2, two, tmp_path / "mixed", dtype=torch.float32)
    ck = read_checkpoint(tmp_path / "mixed")
    assert ck.config.layer_types == ["full_attention", "sliding_attention"]
    assert any(f.severity == "error" and "kv cache group" in f.message for f in ck.findings if f.code == "sliding_window")
