"""The target model: its config (cheap, for pairing checks) and, when needed, the model itself through transformers.

``spec`` is a local folder, a single ``.gguf`` file, or a hub id. Hub ids go through huggingface_hub's cache and
honour ``HF_HUB_OFFLINE``. Aux hidden states are captured at exactly the layers vLLM feeds: id i = the residual
stream after i decoder layers = transformers' ``output_hidden_states[i]`` for i < L; id L is the last layer's output
before the final norm (``vllm_hidden_states``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from .errors import DataError, InputError, TargetError, UnsupportedError
from .fingerprints import is_hub_id
from .formats.io import TensorStore, open_checkpoint_path, read_json
from .formats.vllm import rope_from_config
from .hidden_states import HiddenRecord, SpeculatorsOffline, describe_hidden_states
from .pairing import TargetInfo  # the one definition of the target's config fields (torch-free, for inspect too)

# any of these in a local target folder means it ships a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _local_dir_and_gguf(spec: str) -> tuple[Path | None, str | None]:
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name
    if p.is_dir():
        ggufs = sorted(x.name for x in p.glob("*.gguf"))
        if not (p / "config.json").exists() and ggufs:
            return p, ggufs[0]
        return p, None
    return None, None


def resolve_config(spec: str) -> dict[str, Any]:
    d, gguf = _local_dir_and_gguf(spec)
    if d is not None and gguf is None:
        return read_json(d / "config.json", "target config.json") if (d / "config.json").exists() else _missing(spec)
    if d is not None and gguf is not None:
        from transformers import AutoConfig  # lazy: transformers (0.8 s) stays out of inspect --target (config read as JSON)

        try:
            return AutoConfig.from_pretrained(str(d), gguf_file=gguf).to_dict()
        except Exception as e:
            raise TargetError(f"{spec}: cannot read the GGUF file's config ({str(e)[:160]})") from None
    if is_hub_id(spec):
        try:
            from huggingface_hub import hf_hub_download  # lazy: huggingface_hub (0.2 s), only for a Hub id

            path = hf_hub_download(spec, "config.json")
        except Exception as e:
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
            raise TargetError(
                f"{spec}: config.json not found locally or on the Hub ({e.__class__.__name__})",
                "download the model first (HF_HUB_OFFLINE is set)" if offline else None,
            ) from None
        return read_json(Path(path), "target config.json")
    raise TargetError(f"{spec}: no such folder, .gguf file or hub id")


def _missing(spec: str):
    raise TargetError(f"{spec}: the folder has no config.json")


def target_info(spec: str) -> TargetInfo:
    cfg = resolve_config(spec)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers
        cfg = {**cfg, **cfg["text_config"]}
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise TargetError(f"{spec}: config.json lacks {e} (hidden_size, num_hidden_layers, vocab_size)") from None
    theta, scaling = rope_from_config(cfg)
    return TargetInfo(
        path=spec,
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        model_type=str(cfg.get("model_type", "")),
        raw=cfg,
    )


@contextmanager
def vllm_hidden_states(model: Any, num_layers: int, layer_ids: list[int]) -> Iterator[Any]:
    """transformers' ``output_hidden_states[L]`` is after the final norm; vLLM's aux id L is the last layer's output
    before it. Within this context the final norm's input is recorded when ``L`` is asked for; the yielded function
    maps transformers' hidden states to vLLM's (index i = residual stream after i layers)."""
    rec: dict[str, torch.Tensor] = {}
    hook = None
    if num_layers in layer_ids:
        base = model.get_decoder() if hasattr(model, "get_decoder") else model
        norm = getattr(base, "norm", None)
        if norm is None:
            raise TargetError(f"aux id {num_layers} (the last layer's output before the final norm) cannot be captured: the target has no final 'norm' module")
        hook = norm.register_forward_pre_hook(lambda _m, args: rec.__setitem__("pre", args[0]))

    def states(hs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        out = list(hs)
        if "pre" in rec:
            out[num_layers] = rec["pre"]
        return out

    try:
        yield states
    finally:
        if hook is not None:
            hook.remove()


@dataclass
class Target:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any | None
    info: TargetInfo
    device: torch.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the target runs in (its hidden states come out in it)."""
        return next(self.model.parameters()).dtype

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @property
    def lm_head_bias(self) -> torch.Tensor | None:
        return getattr(self.model.get_output_embeddings(), "bias", None)

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def final_norm_weight(self) -> torch.Tensor | None:
        base = getattr(self.model, "model", None)
        norm = getattr(base, "norm", None)
        return None if norm is None else norm.weight

    @property
    def decoder(self) -> Any:
        """The decoder stack without the lm_head (``get_decoder()``, else ``.model``, else the model itself)."""
        get = getattr(self.model, "get_decoder", None)
        base = get() if callable(get) else None
        return base if base is not None else getattr(self.model, "model", self.model)

    def _aux_states(self, module: Any, input_ids: torch.Tensor, layer_ids: list[int], **kw: Any) -> tuple[torch.Tensor, Any]:
        """The one capture: (aux [B,T,K*Ht] at ``layer_ids`` ascending, ``module``'s output). Ids as vLLM captures
        them (:func:`eagle_migrate.formats.aux_ids.vllm_captured`): 0..L, id L before the final norm."""
        bad = [i for i in layer_ids if not 0 <= i <= self.info.num_layers]
        if bad:
            raise TargetError(f"aux layer ids {bad} are outside the target's 0..{self.info.num_layers}")
        with vllm_hidden_states(self.model, self.info.num_layers, list(layer_ids)) as states:
            out = module(input_ids=input_ids.to(self.device), output_hidden_states=True, use_cache=False, **kw)
            hs = states(out.hidden_states)
        return torch.cat([hs[i] for i in sorted(layer_ids)], dim=-1), out

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, layer_ids: list[int], logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [B,T,K*Ht] at ``layer_ids`` ascending, logits [B,T,V]) for one batch. ``logits_to_keep`` > 0: only the
        logits of the last that many positions (transformers' convention; a long sequence's full logits may not fit)."""
        kw = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
        aux, out = self._aux_states(self.model, input_ids, layer_ids, **kw)
        return aux, out.logits

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, layer_ids: list[int], lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [B,T,K*Ht] at ``layer_ids`` ascending, post-norm last hidden state [B,T,Ht]) without the lm_head.
        ``lengths``: a right-padded batch (positions past a row's length are masked out)."""
        kw: dict[str, Any] = {}
        if lengths is not None:
            kw["attention_mask"] = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long().to(self.device)
        aux, out = self._aux_states(self.decoder, input_ids, layer_ids, **kw)
        return aux, out.last_hidden_state

    def iter_aux(self, sequences: list[list[int]], layer_ids: list[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Stream (input_ids [1,T], aux [1,T,K*Ht], logits [1,T,V]) one sequence at a time (never all in memory)."""
        for seq in sequences:
            ids = torch.tensor([seq], dtype=torch.long)
            aux, logits = self.forward(ids, layer_ids)
            yield ids, aux, logits


def load_tokenizer(target: str) -> Any:
    """The target's tokenizer, or None for a tokenizer-less target (token-id prompts then): the one tokenizer loader
    for a target given by name (a local folder without any of :data:`TOKENIZER_FILES` has none unless it holds a
    ``.gguf``; a single ``.gguf`` file; a hub id)."""
    p = Path(target).expanduser()
    try:
        from transformers import AutoTokenizer  # lazy: transformers (0.8 s) stays out of inspect --target (config read as JSON)

        if p.is_dir():
            if not any((p / f).exists() for f in TOKENIZER_FILES):
                ggufs = sorted(x.name for x in p.glob("*.gguf"))
                if not ggufs:
                    return None
                return AutoTokenizer.from_pretrained(str(p), gguf_file=ggufs[0])
            return AutoTokenizer.from_pretrained(str(p))
        if p.is_file() and p.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        return AutoTokenizer.from_pretrained(target)
    except Exception:
        return None


def load_target(
    spec: str,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    device_map: str | dict | None = None,
    with_tokenizer: bool = True,
) -> Target:
    """Load the target with transformers (``device_map="auto"`` spreads a large target over the visible GPUs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers (0.8 s) stays out of inspect --target (config read as JSON)

    info = target_info(spec)
    d, gguf = _local_dir_and_gguf(spec)
    src = str(d) if d is not None else spec
    kw: dict[str, Any] = {"dtype": dtype}
    if gguf:
        kw["gguf_file"] = gguf
    if device_map is not None:
        kw["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(src, **kw)
    except Exception as e:
        raise TargetError(f"{spec}: transformers cannot load the target ({e.__class__.__name__}: {str(e)[:200]})") from None
    if device_map is None:
        model = model.to(device)
    model.eval()
    tok = None
    if with_tokenizer and d is not None and not gguf and not any((d / f).exists() for f in TOKENIZER_FILES):
        with_tokenizer = False  # transformers 5 builds an empty tokenizer (the model type's default class) from no files
    if with_tokenizer:
        try:
            tok = AutoTokenizer.from_pretrained(src, **({"gguf_file": gguf} if gguf else {}))
        except Exception:
            tok = None  # tokenizer-less toys: token ids only
    dev = next(model.parameters()).device
    return Target(model=model, tokenizer=tok, info=info, device=dev)


class LazyTarget:
    """The target as convert and the aux-id measurement use it: the config at once (``info``), the transformers
    model only on first need (``loaded``), a few weights read straight from the folder without loading the model
    (``weight``), and the aux states of token sequences one at a time (``capture``, through :meth:`Target.capture`)."""

    _NAMES: ClassVar[dict[str, list[str]]] = {
        "embed": ["model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight", "transformer.wte.weight"],
        "lm_head": ["lm_head.weight"],
        "norm": ["model.norm.weight", "norm.weight", "model.language_model.norm.weight", "transformer.ln_f.weight"],
    }

    def __init__(self, spec: str, device: str, dtype: torch.dtype):
        self.spec = spec
        self.info = target_info(spec)
        self.device = device
        self.dtype = dtype
        self._target: Target | None = None
        self._store = None
        # states already captured (the aux-id measurement, eagle_migrate.aux_evidence): sequence -> {vLLM id: [T, Ht]}
        # on the CPU; :meth:`capture` serves a sequence from here when every asked id is in it (one target pass)
        self._kept: dict[tuple[int, ...], dict[int, torch.Tensor]] = {}
        self._kept_next: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def loaded(self) -> Target:
        if self._target is None:
            import importlib.util

            dm = "auto" if self.device.startswith("cuda") and importlib.util.find_spec("accelerate") else None
            self._target = load_target(self.spec, device=self.device, dtype=self.dtype, device_map=dm)
        return self._target

    @property
    def loaded_or_none(self) -> Target | None:
        """The model when something has loaded it already (calibration reuses it), else None."""
        return self._target

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def _weight_store(self) -> Any:
        if self._store is None:
            p = Path(self.spec).expanduser()
            if not p.is_dir():
                return None
            try:
                folder, files, _ = open_checkpoint_path(p)
            except InputError:
                return None
            borrowed = self._borrowed_shards(folder)
            self._store = TensorStore(folder, borrowed if borrowed else files)
        return self._store

    @classmethod
    def _borrowed_shards(cls, folder: Path) -> list[Path] | None:
        """With ``model.safetensors.index.json``: only the shards that hold the embedding, final norm or lm_head (a
        large target's decoder shards are never opened, not even their headers). None without an index."""
        idx = folder / "model.safetensors.index.json"
        if not idx.is_file():
            return None
        try:
            wm = read_json(idx, "model.safetensors.index.json").get("weight_map", {})
        except Exception:  # noqa: BLE001  (a broken index: scan every shard as before)
            return None
        names = [n for ns in cls._NAMES.values() for n in ns]
        shards = sorted({wm[n] for n in names if n in wm})
        return [folder / f for f in shards if (folder / f).is_file()] or None

    def weight(self, kind: Literal["embed", "lm_head", "norm"], mapped: bool = False, load: bool = True) -> torch.Tensor:
        """embed [V, Ht], lm_head [V, Ht], final norm [Ht]: from the loaded model, else read lazily from the folder
        (float32). ``mapped``: from a safetensors folder, a read-only memory-mapped view in the stored dtype (no copy;
        only the rows that are looked up are ever read) -- what the embedding needs."""
        if self._target is None:
            store = self._weight_store()
            if store is not None:
                for n in self._NAMES[kind]:
                    if n in store:
                        return store.mapped(n) if mapped else store.get(n).float()
                if kind == "lm_head":  # tied embeddings
                    return self.weight("embed", mapped=mapped, load=load)
        if not load:
            raise TargetError(f"{self.spec}: the target's {kind} weight is not in a local safetensors folder, and the target "
                              "is not loaded with --hidden-states", "pass the target as a local folder of *.safetensors")
        tg = self.loaded
        if kind == "embed":
            return tg.embed_weight.detach().float().cpu()
        if kind == "lm_head":
            return tg.lm_head_weight.detach().float().cpu()
        w = tg.final_norm_weight
        if w is None:
            raise UnsupportedError(f"{self.spec}: cannot find the target's final norm weight")
        # Gemma-style (1 + w) norms are not plain RMSNorms; the drafter world has plain (w) ones
        return w.detach().float().cpu()

    def keep(self, seq: list[int], states: dict[int, torch.Tensor], next_tokens: torch.Tensor | None = None) -> None:
        """Remember the aux states [T, Ht] per vLLM id of ``seq`` that were captured anyway (the aux-id
        measurement), so that :meth:`capture` does not run the target on it again; ``next_tokens`` [T]: the
        target's greedy next token at each position (the measurement's reference)."""
        self._kept[tuple(seq)] = {i: s.detach().to("cpu", torch.float32) for i, s in states.items()}
        if next_tokens is not None:
            self._kept_next[tuple(seq)] = next_tokens.detach().cpu()

    def kept(self, seq: list[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor | None] | None:
        """(states per vLLM id, next tokens or None) kept for ``seq``, else None."""
        k = self._kept.get(tuple(seq))
        return None if k is None else (k, self._kept_next.get(tuple(seq)))

    def keep_only(self, ids: list[int]) -> None:
        """Drop the kept states of every id but ``ids`` (once the ids are decided)."""
        for d in self._kept.values():
            for i in [i for i in d if i not in ids]:
                del d[i]

    @property
    def kept_sequences(self) -> int:
        return len(self._kept)

    def capture(self, seqs: list[list[int]], aux_ids: list[int], want_last: bool) -> Iterator[HiddenRecord]:
        """Aux states at vLLM ids (id L before the final norm), one sequence at a time; ``last`` is the post-norm
        final state (``want_last``). A sequence whose states at every id were kept (:meth:`keep`) is not run again."""
        for seq in seqs:
            kept = self._kept.get(tuple(seq))
            if not want_last and kept is not None and all(i in kept for i in aux_ids):
                yield HiddenRecord(torch.tensor(seq, dtype=torch.long), torch.cat([kept[i] for i in sorted(aux_ids)], dim=-1), None)
                continue
            tg = self.loaded
            ids = torch.tensor([seq], dtype=torch.long, device=tg.device)
            aux, last = tg.capture(ids, aux_ids)
            yield HiddenRecord(ids[0].cpu(), aux[0].float(), last[0].float() if want_last else None)
            del aux, last


class TargetWeights:
    """The target as ``--hidden-states`` uses it: the config and the few tensors a drafter borrows (embeddings,
    final norm, ``lm_head``), read lazily from the target's safetensors (memory-mapped; only the rows that are looked
    up are read). No model is built and no decoder layer is read: a target whose layers do not fit (or are absent)
    works. Has what :func:`eagle_migrate.loader.load_drafter`, :class:`eagle_migrate.features.TargetHead` and
    the calibration read of a Target; ``tokenizer`` is None."""

    tokenizer = None
    model = None
    lm_head_bias = None

    def __init__(self, spec: str):
        self.spec = spec
        self._lazy = LazyTarget(spec, "cpu", torch.float32)
        self.info = self._lazy.info
        self.device = torch.device("cpu")
        self.dtype = torch.float32

    @property
    def embed_weight(self) -> torch.Tensor:
        return self._lazy.weight("embed", mapped=True, load=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self._lazy.weight("lm_head", mapped=True, load=False)

    @property
    def final_norm_weight(self) -> torch.Tensor:
        return self._lazy.weight("norm", load=False)


def check_against_capture(target: Target, folder: Path | str, aux_ids: list[int], index: int = 0,
                          tolerance: float = 0.05) -> list[float]:
    """The aux and last slices of file ``index`` of a speculators-offline folder against a fresh capture of the same
    tokens by ``target`` (loaded: only where the target fits; ``--hidden-states`` itself never does this): the
    relative L2 error per slice, the slices being the drafter's ``aux_ids`` ascending then layer L. Raises DataError
    naming the file and the slice when one is beyond ``tolerance`` (bf16 storage: about 0.5 %)."""
    info = describe_hidden_states(Path(folder))
    if info.layout != "speculators-offline":
        raise DataError(f"{folder}: not a speculators-offline folder")
    hs, ids, _ = SpeculatorsOffline(info).raw(index)
    L = target.info.num_layers
    want = sorted(aux_ids) + ([] if L in aux_ids else [L])
    if hs.shape[1] != len(want):
        raise DataError(f"{info.files[index]}: {hs.shape[1]} layer slices, the ids {want} need {len(want)}")
    fresh, _ = target.capture(ids[None], want)
    fresh = fresh[0].float().cpu().view(ids.numel(), len(want), -1)
    errs = [float((hs[:, s].float() - fresh[:, s]).norm() / fresh[:, s].norm().clamp_min(1e-12)) for s in range(len(want))]
    bad = [s for s, e in enumerate(errs) if e > tolerance]
    if bad:
        s = bad[0]
        raise DataError(f"{info.files[index]}: slice {s} is not layer {want[s]} of the target (relative error {errs[s]:.3f} "
                        f"against a fresh capture; per slice {', '.join(f'{e:.3f}' for e in errs)})")
    return errs
