"""``validate --server URL`` with nothing but the URL: the suites tokenised by the server itself, and what the server
does not say about its drafter recorded as unknown (or read from the drafter folder, when one is given).

:class:`ServerTokenizer` is the target's tokenizer as the server applies it, through vLLM's ``POST /tokenize`` and
``POST /detokenize``: it offers what the suites (``corpora``) ask of a tokenizer, so they build unchanged. A chat
request is rendered by the server's own chat template (``/tokenize`` with ``messages``, what
``/v1/chat/completions`` applies); its text is kept with its ids, so encoding that text again gives exactly the
server's ids (decoding and re-encoding could merge or split tokens at the seams). A server whose model has no chat
template (a base model served for completions: ``/tokenize`` refuses messages) is asked once (:func:`chat_refusal`);
the tokenizer then offers no template, and the suites render chats as plain transcripts.

:func:`drafter_record`: the drafter's aux layer ids, flags and hashes, from its folder when one is given, else each
named as unknown (the server exports k and, with ``VLLM_SERVER_DEV_MODE=1``, the drafter's name; nothing else).
Imports: errors, formats (the reader, hashes), engines.server_client.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import EngineError, ServerError
from ..formats import read_checkpoint
from ..formats.io import open_checkpoint_path, sha256_files
from .server_client import ServerClient

DRAFTER_FIELDS = ("aux_layer_ids", "flags", "weights_sha256", "config_sha256")


class ServerTokenizer:
    """The server's tokenizer behind the interface the suites use (``tok(text, add_special_tokens=)``,
    ``decode``, ``apply_chat_template``, ``chat_template``, ``bos_token_id``)."""

    chat_template = "the server's"  # truthy: corpora renders chats through apply_chat_template (the server's)

    def __init__(self, client: ServerClient):
        self._client = client
        self._rendered: dict[str, list[int]] = {}
        try:
            plain = client.tokenize_text("hi", add_special_tokens=False)
            special = client.tokenize_text("hi", add_special_tokens=True)
        except EngineError as e:
            raise ServerError(f"the server at {client.url} cannot tokenise ({e.message})",
                              "it was started without a tokenizer (--skip-tokenizer-init?): pass --target (its "
                              "tokenizer and config) to build the suites here") from None
        # the BOS the tokenizer adds to plain text on its own (Llama style), which corpora keeps for other templates
        self.bos_token_id = special[0] if len(special) == len(plain) + 1 and special[1:] == plain else None
        self.bos_token = self.eos_token = ""
        self.chat_refused = chat_refusal(client)
        if self.chat_refused is not None:  # a base model: corpora renders chats as plain transcripts (no template)
            self.chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        if not add_special_tokens and text in self._rendered:
            return {"input_ids": list(self._rendered[text])}
        return {"input_ids": self._client.tokenize_text(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._client.detokenize(ids)

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = True, **_: Any) -> Any:
        ids = self._client.tokenize_messages([{"role": m["role"], "content": m["content"]} for m in messages],
                                             add_generation_prompt=add_generation_prompt)
        if tokenize:
            return ids
        text = self._client.detokenize(ids)
        self._rendered[text] = ids
        return text


def chat_refusal(client: ServerClient) -> str | None:
    """Why the server cannot render a chat request (``/tokenize`` with messages refused: a base model without a chat
    template, "default chat template is no longer allowed"), or None when it renders one."""
    try:
        client.tokenize_messages([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except EngineError as e:
        return e.message.split(": ", 1)[-1][:200]
    return None


class ServedModel:
    """What the suites need of the target's config (its context) when only the server is known."""

    def __init__(self, max_model_len: int | None):
        self.max_position_embeddings = max_model_len
        self.vocab_size = None


def drafter_record(checkpoint: str | os.PathLike | None, served_as: str | None) -> dict[str, Any]:
    """The drafter as report.json records it beside what the server said: its aux layer ids, flags and hashes from
    the folder ``checkpoint`` when it is a local folder (weights_sha256 as validate's, config_sha256 the sha256 of
    its config.json), else null and named in ``unknown`` (never guessed).
    ``served_as``: the drafter's name as the server reports it (/server_info), if it does."""
    out: dict[str, Any] = {"source": None, "served_as": served_as, **{k: None for k in DRAFTER_FIELDS}}
    if checkpoint is None or not Path(checkpoint).exists():
        out["unknown"] = list(DRAFTER_FIELDS)
        out["note"] = ("the server does not report its drafter's aux layer ids, flags or hashes; pass the drafter "
                       "folder (CKPT) to record them (it is read, never used to measure)")
        return out

    path = Path(checkpoint)
    ck = read_checkpoint(path)
    c = ck.config
    flags = [f for f in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual") if getattr(c, f, False)]
    cfg = path / "config.json" if path.is_dir() else None
    out.update(source=str(path), aux_layer_ids=list(c.aux_layer_ids) if c.aux_layer_ids is not None else None,
               flags=flags, weights_sha256=sha256_files(open_checkpoint_path(path)[1]),
               config_sha256=hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg is not None and cfg.is_file() else None)
    out["unknown"] = [k for k in DRAFTER_FIELDS if out[k] is None]
    return out
