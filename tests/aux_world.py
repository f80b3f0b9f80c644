"""A tiny target whose layers are distinguishable, and drafters that work only with the right aux layers.

Unlike the successor toy (``eagle_migrate/toy.py``, every layer's state is the token's embedding up to scale), each
decoder layer k of this target writes its own component: the token x, permuted by a layer-specific permutation
``PERMS[k]``, into its own block of the residual stream, with magnitude ``M**(k+1)``. So vLLM's aux id i (the
residual stream after i layers) holds blocks 0..i, and block i dominates:

    h_i = sum_{b <= i} M**b * onehot_block_b(PERMS[b-1](x))        (PERMS[-1] = identity, block 0 = embedding)

The target's greedy next token is x + 1 (its lm_head reads block L). The ``right`` drafter for vLLM ids ``ids``
decodes every block of fc chunk j with the inverse of ``PERMS[ids[j] - 1]``: with the right states the dominant
blocks decode to x, and it predicts x + 2 = the target's next token after x + 1 (step-0 agreement 1 on the target's
own text); with the ids one layer off the dominant block decodes to another token (agreement about 1/V). The
``blind`` drafter reads only block 0 (the embedding, present in every state): both readings agree exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_migrate.drafter.config import DrafterConfig
from eagle_migrate.formats.output import save_safetensors, write_json

V = 16  # vocabulary = block size
L = 4  # target layers (the case: ids [1, 2, 3] on a 4-layer target)
H = (L + 1) * V  # blocks 0..L
M = 4.0  # block b has magnitude M**b: the newest block dominates the sum of the older ones
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 32
IDS = [1, 2, 3]  # the drafter's true aux ids (vLLM convention)


def perms(seed: int = 1) -> list[list[int]]:
    """PERMS[k]: the permutation layer k applies (no two consecutive ones agree anywhere)."""
    g = torch.Generator().manual_seed(seed)
    out: list[list[int]] = [list(range(V))]  # PERMS[-1] stands in as the identity for block 0
    while len(out) < L + 1:
        p = torch.randperm(V, generator=g).tolist()
        if all(p[x] != out[-1][x] for x in range(V)):
            out.append(p)
    return out[1:]


PERMS = perms()


def _perm(k: int) -> list[int]:
    return list(range(V)) if k < 0 else PERMS[k]


def _block(b: int, pos: int) -> int:
    return b * V + pos


def target_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    sd: dict[str, torch.Tensor] = {}
    emb = torch.zeros(V, H)
    for x in range(V):
        emb[x, _block(0, x)] = 1.0
    sd["model.embed_tokens.weight"] = emb
    sd["model.norm.weight"] = torch.ones(H)
    head = torch.zeros(V, H)
    for t in range(V):
        head[t, _block(L, _perm(L - 1)[(t - 1) % V])] = 1.0
    sd["lm_head.weight"] = head
    for k in range(L):
        p = f"model.layers.{k}."
        sd[p + "self_attn.q_proj.weight"] = torch.randn(HEADS * HEAD_DIM, H, generator=g) * 0.1
        sd[p + "self_attn.k_proj.weight"] = torch.randn(KV_HEADS * HEAD_DIM, H, generator=g) * 0.1
        sd[p + "self_attn.v_proj.weight"] = torch.randn(KV_HEADS * HEAD_DIM, H, generator=g) * 0.1
        sd[p + "self_attn.o_proj.weight"] = torch.zeros(H, HEADS * HEAD_DIM)
        # layer k's input holds blocks 0..k; its norm scales block 0's entry to s0
        rms = math.sqrt(sum(M ** (2 * b) for b in range(k + 1)) / H)
        s0 = 1.0 / rms
        gain = float(F.silu(torch.tensor(s0)) * s0)
        gate = torch.zeros(V, H)
        for x in range(V):
            gate[x, _block(0, x)] = 1.0
        sd[p + "mlp.gate_proj.weight"] = gate
        sd[p + "mlp.up_proj.weight"] = gate.clone()
        down = torch.zeros(H, V)
        for x in range(V):
            down[_block(k + 1, PERMS[k][x]), x] = M ** (k + 1) / gain
        sd[p + "mlp.down_proj.weight"] = down
        sd[p + "input_layernorm.weight"] = torch.ones(H)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(H)
    return sd


def target_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": V,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": L,
        "vocab_size": V, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": V - 1,
        "torch_dtype": "float32",
    }


def write_target(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(target_state_dict(), out / "model.safetensors", {"format": "pt"})
    write_json(out / "config.json", target_config())
    return out


def drafter_config(ids: list[int] = IDS) -> DrafterConfig:
    return DrafterConfig(
        hidden_size=H, target_hidden_size=H, num_aux=len(ids), vocab_size=V, draft_vocab_size=V, intermediate_size=V,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=1024,
        rms_norm_eps=1e-6, aux_layer_ids=list(ids),
    )


def drafter_state_dict(kind: str = "right", ids: list[int] = IDS) -> dict[str, torch.Tensor]:
    """``right``: works only with the aux states at ``ids``; ``blind``: reads the embedding block only."""
    g = torch.Generator().manual_seed(2)
    k = len(ids)
    fc = torch.zeros(H, k * H)
    for j, i in enumerate(ids):
        inv = {v: x for x, v in enumerate(_perm(i - 1))}
        for b in range(L + 1) if kind == "right" else (0,):
            for pos in range(V):
                fc[inv[pos] if kind == "right" else pos, j * H + _block(b, pos)] = 1.0
    sd = {"fc.weight": fc}
    sd["layers.0.self_attn.q_proj.weight"] = torch.randn(HEADS * HEAD_DIM, 2 * H, generator=g) * 0.1
    sd["layers.0.self_attn.k_proj.weight"] = torch.randn(KV_HEADS * HEAD_DIM, 2 * H, generator=g) * 0.1
    sd["layers.0.self_attn.v_proj.weight"] = torch.randn(KV_HEADS * HEAD_DIM, 2 * H, generator=g) * 0.1
    sd["layers.0.self_attn.o_proj.weight"] = torch.zeros(H, HEADS * HEAD_DIM)
    sd["layers.0.mlp.gate_proj.weight"] = torch.zeros(V, H)
    sd["layers.0.mlp.up_proj.weight"] = torch.zeros(V, H)
    sd["layers.0.mlp.down_proj.weight"] = torch.zeros(H, V)
    for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        sd[f"layers.0.{n}.weight"] = torch.ones(H)
    sd["norm.weight"] = torch.ones(H)
    head = torch.zeros(V, H)
    for t in range(V):
        head[t, _block(0, (t - 2) % V)] = 1.0  # g encodes x_i; the target's next token after x_i + 1 is x_i + 2
    sd["lm_head.weight"] = head
    return sd
