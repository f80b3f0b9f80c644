"""The reference engine: chain speculative decoding in plain PyTorch (transformers target + our EagleDrafter).

Filled in below; :func:`load_drafter` turns any checkpoint folder into an :class:`EagleDrafter` wired to a target
(vLLM's sharing rules: no ``embed_tokens`` -> the target's embedding, no ``lm_head`` -> the target's head).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..drafter import DrafterConfig, EagleDrafter
from ..errors import CheckpointError


def _read_checkpoint(path: Path) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """(config, canonical state dict) through eagle_migrate.formats when it has a reader, else the vLLM layout."""
    try:
        from .. import formats as _formats

        reader = next((getattr(_formats, n) for n in ("read_checkpoint", "open_checkpoint", "load_checkpoint")
                       if callable(getattr(_formats, n, None))), None)
    except ImportError:
        reader = None
    if reader is not None:
        ck = reader(path)
        return ck.config, ck.state_dict()
    return _read_vllm_layout(path)


def _read_vllm_layout(path: Path) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    from ..formats.io import read_json, weight_files
    from ..formats.vllm import rope_from_config

    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (the reference engine reads the vLLM layout)")
    c = read_json(path / "config.json", "drafter config.json")
    sd: dict[str, torch.Tensor] = {}
    from safetensors.torch import load_file

    for f in weight_files(path):
        if f.suffix == ".safetensors":
            sd.update(load_file(str(f)))
        else:
            from ..formats.io import load_bin_safely

            sd.update(load_bin_safely(f))
    sd = {k.removeprefix("model.").replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    ec = c.get("eagle_config") or {}
    ids = c.get("eagle_aux_hidden_state_layer_ids") or ec.get("eagle_aux_hidden_state_layer_ids")
    theta, scaling = rope_from_config(c)
    h = int(c["hidden_size"])
    fc = sd.get("fc.weight")
    ht = int(c.get("target_hidden_size") or h)
    k = int(c.get("num_aux_hidden_states") or (len(ids) if ids else (fc.shape[1] // ht if fc is not None else 3)))
    layers = 1 + max((int(n.split(".")[1]) for n in sd if n.startswith("layers.")), default=0)
    cfg = DrafterConfig(
        hidden_size=h, target_hidden_size=ht, num_aux=k, vocab_size=int(c["vocab_size"]),
        draft_vocab_size=int(c.get("draft_vocab_size") or c["vocab_size"]),
        intermediate_size=int(c["intermediate_size"]), num_attention_heads=int(c["num_attention_heads"]),
        num_key_value_heads=int(c.get("num_key_value_heads") or c["num_attention_heads"]),
        head_dim=int(c.get("head_dim") or h // int(c["num_attention_heads"])), num_layers=layers,
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
        aux_layer_ids=sorted(ids) if ids else None, fc_norm=bool(c.get("fc_norm", False)),
        norm_output=bool(c.get("norm_output", False)),
        norm_before_fc=bool(ec.get("norm_before_fc", c.get("norm_before_fc", False))),
        norm_before_residual=bool(c.get("norm_before_residual", False)),
        attention_bias=bool(c.get("attention_bias", False)), fc_bias="fc.bias" in sd,
        has_lm_head="lm_head.weight" in sd, has_embed_tokens="embed_tokens.weight" in sd,
    )
    return cfg, sd


def load_drafter(
    checkpoint: str | Path,
    target: Any | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> EagleDrafter:
    """An :class:`EagleDrafter` with the checkpoint's weights, sharing the target's embedding / head where vLLM would.

    ``target`` is an :class:`eagle_migrate.target.Target` (or anything with ``embed_weight``/``lm_head_weight``).
    """
    cfg, sd = _read_checkpoint(Path(checkpoint))
    m = EagleDrafter(cfg)
    sd = {k: v for k, v in sd.items() if k != "t2d"}
    if "d2t" in sd and not cfg.uses_d2t:
        sd.pop("d2t")
    if "embed_tokens.weight" not in sd:
        if target is None:
            raise CheckpointError(f"{checkpoint}: no embed_tokens.weight; pass the target to share its embedding")
        sd["embed_tokens.weight"] = target.embed_weight.detach().float().cpu()
    if "lm_head.weight" not in sd:
        if target is None or cfg.draft_vocab_size != cfg.vocab_size:
            raise CheckpointError(f"{checkpoint}: no lm_head.weight and the target's head cannot be shared")
        sd["lm_head.weight"] = target.lm_head_weight.detach().float().cpu()
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [n for n in missing if not n.startswith("_")]
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint}: weights do not fit the drafter module (missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return m.to(device=device, dtype=dtype).eval()
