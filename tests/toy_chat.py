"""A chat tokenizer for the toy targets (vocabulary 64 = their vocab_size) and a small chat client, so a real vLLM
server of the toy pair can serve `/v1/chat/completions` and `/tokenize` as a real deployment does.

The tokenizer is one token per character (lower-cased; letters, digits, space and common punctuation) plus four
special tokens (`<s>` = 0, the toy's bos id, `</s>` = 63, its eos id, and the chat markers `<|user|>`,
`<|assistant|>`, `<|system|>`), with a chat template of its own. Characters outside the vocabulary become `<unk>`.
In the successor world any token id works (the target's greedy next token is x + 1), so the toy pairs' exact
acceptance lengths hold on chat traffic too; in the drift world they hold while the context stays short (AL 4 up to
~768 tokens, 2 at ~1k: tests/integration/test_watch_vllm.py).

:func:`chat` sends one greedy chat request and returns what its response's ``usage`` says, from which the spec-decode
counters a request must add are implied (:func:`implied_drafts`).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from pathlib import Path

VOCAB = 64
SPECIALS = {"<s>": 0, "<|user|>": 1, "<|assistant|>": 2, "<|system|>": 3, "<unk>": 4, "</s>": VOCAB - 1}
CHARS = string.ascii_lowercase + string.digits + " .,?!'\":;-()\n/=+*_<>[]"  # 58: every id below 64 used
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def write_tokenizer(folder: Path) -> Path:
    """Write the character tokenizer (tokenizer.json, its config and the chat template) into the target folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = dict(SPECIALS)
    free = [i for i in range(VOCAB) if i not in vocab.values()]
    for ch, i in zip(CHARS, free):
        vocab[ch] = i
    assert len(vocab) <= VOCAB and max(vocab.values()) < VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(folder)
    return folder


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


def chat(url: str, content: str, max_tokens: int, *, timeout: float = 300.0) -> Usage:
    """One greedy chat request (``ignore_eos``: exactly ``max_tokens`` out) to the server at ``url`` (…/v1)."""
    import httpx

    body = {"model": _model(url), "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}
    r = httpx.post(url.rstrip("/") + "/chat/completions", json=body, timeout=timeout)
    r.raise_for_status()
    u = r.json()["usage"]
    return Usage(int(u["prompt_tokens"]), int(u["completion_tokens"]))


_MODELS: dict[str, str] = {}


def _model(url: str) -> str:
    import httpx

    if url not in _MODELS:
        _MODELS[url] = httpx.get(url.rstrip("/") + "/models", timeout=30).json()["data"][0]["id"]
    return _MODELS[url]


def implied_drafts(completion_tokens: int, k: int = 3) -> int:
    """Drafts (verification steps) of one request whose every draft is accepted: the first token comes from the
    prefill, each step then yields k + 1 tokens (a last step cut by max_tokens still counts in full, as in vLLM)."""
    return math.ceil((completion_tokens - 1) / (k + 1)) if completion_tokens > 1 else 0
