"""Building a fresh EAGLE-3 / EAGLE-3.1 drafter for SmolLM2-135M-Instruct from scratch: the one home of what the
from-scratch trainers share (``benchmarks/train_smollm2_eagle3.py`` on the CPU, ``benchmarks/gpu/train_source.py``
on a lent GPU). The package itself only converts and calibrates existing drafters; its trainer
(``eagle_migrate.train.fit``) is reused here unchanged.

* the drafter shape (:func:`smollm2_drafter_config`), the aux layers and the ShareGPT role names;
* whole ShareGPT conversations as chat messages (:func:`sharegpt_messages`);
* the draft vocabulary: token frequencies (:func:`token_frequencies`), the most frequent ids
  (:func:`build_draft_vocab`), both from tokenized sequences (:func:`draft_vocab`);
* fresh weights from the target (:func:`init_from_target`);
* held-out simulated acceptance on chat prompts (:func:`heldout_simulated_al`) and writing the result in the vLLM
  layout with the embeddings left out (:func:`write_drafter`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_migrate import assets
from eagle_migrate.corpora import iter_sharegpt
from eagle_migrate.drafter import DrafterConfig, EagleDrafter

ROLE = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
        "bing": "assistant", "assistant": "assistant", "system": "system"}
AUX_IDS = [2, 15, 27]  # SmolLM2-135M (30 layers): low, middle, last-but-two, in vLLM's convention
SMOLLM2_VOCAB = 49152


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def smollm2_drafter_config(draft_vocab: int, *, norm_before_residual: bool, eagle31: bool = False) -> DrafterConfig:
    """SmolLM2's drafter: 1 decoder layer, H = 576 (= the target's), I = 1536, 9 heads / 3 KV heads, aux layers
    :data:`AUX_IDS`; ``eagle31`` adds EAGLE-3.1's fc_norm + norm_output."""
    return DrafterConfig(
        hidden_size=576, target_hidden_size=576, num_aux=3, vocab_size=SMOLLM2_VOCAB, draft_vocab_size=draft_vocab,
        intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_layers=1,
        rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, aux_layer_ids=list(AUX_IDS),
        norm_before_residual=norm_before_residual, fc_norm=eagle31, norm_output=eagle31,
    )


def sharegpt_messages(start: int = 0, count: int | None = None) -> list[list[dict[str, str]]]:
    """Chat messages of the usable ShareGPT records (non-empty turns, user first) from record ``start`` on, at most
    ``count`` of them (None: to the end of the file), in file order. Whole conversations (the project's data module
    renders prompts; a trainer needs the replies too)."""
    out: list[list[dict[str, str]]] = []
    for i, r in enumerate(iter_sharegpt(assets.sharegpt_path())):
        if i < start:
            continue
        if count is not None and len(out) >= count:
            break
        msgs = [{"role": ROLE.get(str(m.get("from", "")).lower(), "user"), "content": str(m.get("value", ""))}
                for m in r.get("conversations", []) if str(m.get("value", "")).strip()]
        if msgs and msgs[0]["role"] != "assistant":
            out.append(msgs)
    return out


def first_turn_prompt(tok: Any, msgs: Sequence[dict[str, str]], max_len: int) -> list[int] | None:
    """The conversation's first user turn under the native chat template with the generation prompt (None when
    longer than ``max_len`` tokens)."""
    first = [m for m in msgs if m["role"] != "assistant"][:1]
    ids = list(tok.apply_chat_template(first, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
    return ids if len(ids) <= max_len else None


def token_frequencies(sequences: Iterable[Sequence[int]], masks: Iterable[Sequence[bool]] | None = None) -> Counter:
    c: Counter = Counter()
    if masks is None:
        for s in sequences:
            c.update(s)
    else:
        for s, m in zip(sequences, masks):
            c.update(t for t, keep in zip(s, m) if keep)
    return c


def build_draft_vocab(freqs: Counter, vocab_size: int, draft_vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """[Vd] sorted target ids of the draft vocabulary: ``always`` first, then the most frequent ids, then the lowest
    unseen ids to fill up. ``d2t = t_ids - arange(Vd)``."""
    chosen: list[int] = []
    seen = set()
    for t in list(always) + [t for t, _ in freqs.most_common()]:
        if 0 <= t < vocab_size and t not in seen and len(chosen) < draft_vocab_size:
            chosen.append(t)
            seen.add(t)
    t = 0
    while len(chosen) < draft_vocab_size:
        if t not in seen:
            chosen.append(t)
            seen.add(t)
        t += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


def draft_vocab(tok: Any, sequences: Iterable[Sequence[int]], vocab_size: int, draft_vocab_size: int) -> tuple[torch.Tensor, float]:
    """(target ids of the draft vocabulary, the share of the tokens of ``sequences`` it covers): the most frequent
    ids, the tokenizer's special ids always in."""
    freqs = token_frequencies(sequences)
    specials = [i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None]
    t_ids = build_draft_vocab(freqs, vocab_size, draft_vocab_size, always=specials)
    cover = sum(freqs[int(t)] for t in t_ids) / max(1, sum(freqs.values()))
    return t_ids, cover


def init_from_target(model: EagleDrafter, target: Any, t_ids: torch.Tensor, seed: int = 0, std: float = 0.02) -> None:
    """Fresh EAGLE-3 weights for ``target``: embeddings from the target, lm_head = the target's output rows for the
    draft vocabulary, final norm from the target, d2t from ``t_ids``; the rest random (normal ``std``), norms 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or ".norm" in n or n.startswith("fc_norm") or n == "norm.weight":
                p.fill_(1.0)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.zero_()
        emb = target.model.get_input_embeddings().weight.detach().float().cpu()
        if model.embed_tokens.weight.shape == emb.shape:
            model.embed_tokens.weight.copy_(emb)
        head = target.model.get_output_embeddings().weight.detach().float().cpu()
        if model.lm_head.weight.shape[1] == head.shape[1]:
            model.lm_head.weight.copy_(head[t_ids])
        get = getattr(target.model, "get_decoder", None)
        base = get() if callable(get) else getattr(target.model, "model", target.model)
        fn = getattr(base, "norm", None)
        if fn is not None and fn.weight.shape == model.norm.weight.shape:
            model.norm.weight.copy_(fn.weight.detach().float().cpu())
        if model.cfg.uses_d2t:
            model.d2t.copy_(t_ids - torch.arange(len(t_ids)))


def heldout_simulated_al(model: EagleDrafter, target: Any, prompts: Sequence[Sequence[int]], new_tokens: int, k: int = 3,
                         device: torch.device | str = "cpu"):
    """Simulated AL at depth ``k`` on the target's greedy continuations (``new_tokens``) of ``prompts``
    (``eagle_migrate.judge.SimulatedAcceptance``)."""
    from eagle_migrate.judge import greedy_continuations, simulated_acceptance
    from eagle_migrate.features import FeatureStore

    held = greedy_continuations(target, prompts, new_tokens)
    hs = FeatureStore(target, [h.ids for h in held], AUX_IDS, batch=8, seq_len=10**6)
    return simulated_acceptance(model, hs, [h.prompt_len for h in held], k, device=device,
                                autocast=torch.device(device).type == "cuda")


def write_drafter(model: EagleDrafter, out: Path, *, dtype: torch.dtype, trained_by: str, training: dict,
                  finish: Callable[[Path], None] | None = None) -> None:
    """``model`` in the vLLM layout at ``out`` (atomic, replaces it), the embeddings left out (vLLM shares the
    target's when H = Ht), ``training`` under ``eagle_migrate_training`` in config.json; ``finish(folder)`` runs on
    the temporary folder before it is renamed (resharding, extra files)."""
    from eagle_migrate.formats.output import atomic_output_dir
    from eagle_migrate.formats.write import write_vllm

    sd = {n: p.detach().float().cpu() for n, p in model.state_dict().items() if n != "embed_tokens.weight"}
    with atomic_output_dir(out, force=True) as tmp:
        write_vllm(model.cfg, sd, tmp, dtype=dtype, metadata={"trained_by": trained_by},
                   extra_config={"eagle_migrate_training": training})
        if finish is not None:
            finish(tmp)
