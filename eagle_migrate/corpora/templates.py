"""Chat templates and rendering: a :class:`~.sources.Conversation` -> prompt text -> token ids.

:func:`render` uses the tokenizer's chat template, or one of the other templates in :data:`TEMPLATES` (template
shift), optionally with a replacement system prompt (:data:`SYSTEM_PROMPTS`). :data:`SHIFT_VARIANTS` lists the
(template, system prompt) pairs the template-shift suite renders every request under.

Tokenizer-less targets (the toy successor world has no tokenizer) render through :class:`ByteTokenizer`: the same
text, rendered with the same templates, becomes its UTF-8 bytes taken modulo the target's vocabulary size. Prompt
lengths and template differences survive; meaning does not (the toy does not need it). May import: errors, sources.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from .sources import Conversation

# Other chat templates, as Jinja (the same language HF chat templates use); special tokens a tokenizer lacks are
# tokenized as plain text -- exactly what a deployment with the "wrong" template feeds the model.
TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim"
        " + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
    "mistral": (
        "{% set sys = namespace(t='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set sys.t = m['content'] + '\n\n' %}"
        "{% elif m['role'] == 'user' %}{{ '[INST] ' + sys.t + m['content'] + ' [/INST]' }}{% set sys.t = '' %}"
        "{% else %}{{ ' ' + m['content'] + '</s>' }}{% endif %}{% endfor %}"
    ),
    "gemma": (
        "{% set sys = namespace(t='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set sys.t = m['content'] + '\n\n' %}"
        "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' + sys.t + m['content']"
        " + '<end_of_turn>\n' }}{% set sys.t = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "alpaca": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}{% elif m['role'] == 'user' %}"
        "{{ '### Instruction:\n' + m['content'] + '\n\n' }}{% else %}{{ '### Response:\n' + m['content'] + '\n\n' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}"
    ),
    "plain": (
        "{% for m in messages %}{{ m['role'] | capitalize + ': ' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
}

# Unusual system prompts (template-shift suite): terse, long policy, role-play, another language.
SYSTEM_PROMPTS: dict[str, str] = {
    "terse": "Answer in as few words as possible. Never use lists, never apologise, never add a closing remark.",
    "policy": (
        "You are the virtual assistant of Northwind Savings Bank. Follow these rules in every reply. 1. Never ask for "
        "or repeat a full card number, PIN or password. 2. If a question concerns a specific account, tell the customer "
        "to log in to online banking or call the number on the back of their card. 3. Do not give investment, tax or "
        "legal advice; explain general concepts only. 4. Keep a warm, professional tone and use plain language. "
        "5. If you are unsure, say so and point to a human adviser. 6. Questions unrelated to banking may be answered "
        "briefly. Today's date is 14 March and branch opening hours are 9:00 to 17:00, Monday to Friday."
    ),
    "pirate": "Ye be Captain Saltbeard, an old sea dog. Answer every question as a pirate would, arr, but stay helpful.",
    "spanish": "Eres un asistente útil y amable. Responde siempre en español, aunque te escriban en otro idioma.",
}

# (group label, template, system prompt key): the template-shift suite renders every request under each.
SHIFT_VARIANTS: list[tuple[str, str | None, str | None]] = [
    ("native+policy", None, "policy"),
    ("native+pirate", None, "pirate"),
    ("chatml", "chatml", None),
    ("llama3", "llama3", None),
    ("mistral", "mistral", None),
    ("gemma+terse", "gemma", "terse"),
    ("alpaca", "alpaca", None),
    ("plain+spanish", "plain", "spanish"),
]


class ByteTokenizer:
    """Stand-in tokenizer for tokenizer-less targets: UTF-8 bytes modulo the vocabulary size (no chat template)."""

    chat_template = None
    bos_token_id = None

    def __init__(self, vocab_size: int):
        if vocab_size < 2:
            raise DataError(f"vocab_size {vocab_size} is too small for token-id prompts")
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="ignore")


def _jinja(template: str, messages: list[dict[str, str]], add_generation_prompt: bool, tokenizer: Any) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # lazy: jinja2 comes with transformers, not with us; only a chat template needs it

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=getattr(tokenizer, "bos_token", "") or "", eos_token=getattr(tokenizer, "eos_token", "") or "",
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(text)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _with_system(messages: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    if system_prompt is None:
        return messages
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": system_prompt}, *rest]


def render_text(conv: Conversation, tokenizer: Any, template_variant: str | None = None,
                system_prompt: str | None = None, add_generation_prompt: bool = True, *, whole: bool = False) -> str:
    """The prompt as text (the tokenizer's own chat template, or ``TEMPLATES[template_variant]``). ``whole``: every
    message, the assistant's replies included, and no generation prompt."""
    msgs = _with_system(conv.messages if whole else conv.prompt_messages(), SYSTEM_PROMPTS.get(system_prompt or "", system_prompt))
    add_generation_prompt = add_generation_prompt and not whole
    if template_variant is not None:
        if template_variant not in TEMPLATES:
            raise DataError(f"unknown template variant '{template_variant}'", f"choose from {', '.join(TEMPLATES)}")
        return _jinja(TEMPLATES[template_variant], msgs, add_generation_prompt, tokenizer)
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as e:
            raise DataError(f"the tokenizer's chat template failed on {conv.id or 'a request'} ({str(e)[:160]})") from None
    return _jinja(TEMPLATES["plain"], msgs, add_generation_prompt, tokenizer)  # base models: plain transcript


def render(conv: Conversation, tokenizer: Any, template_variant: str | None = None, system_prompt: str | None = None,
           add_generation_prompt: bool = True, *, whole: bool = False) -> list[int]:
    """Token ids of the prompt. ``system_prompt``: a key of :data:`SYSTEM_PROMPTS` or literal text (replaces any
    system turn). ``whole``: the whole conversation, replies included, no generation prompt. A conversation given as
    token ids is returned as is. ``tokenizer`` may be a :class:`ByteTokenizer`."""
    if conv.token_ids is not None:
        return list(conv.token_ids)
    if tokenizer is None:
        raise DataError("rendering text needs a tokenizer (the target has none)", "pass token_ids prompts, or use ByteTokenizer")
    text = render_text(conv, tokenizer, template_variant, system_prompt, add_generation_prompt, whole=whole)
    ids = _encode(tokenizer, text)
    if template_variant is not None:  # the native template decides BOS; keep the same convention for the others
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and ids[:1] != [bos] and _native_starts_with_bos(tokenizer):
            ids = [bos, *ids]
    return ids


def render_within(conv: Conversation, tokenizer: Any, room: int) -> list[int]:
    """The prompt's token ids within ``room`` tokens, still a request: a longer one has its last user turn's text cut
    from the end (the longest cut that fits, by bisection on characters), so that the turn's end and the generation
    prompt stay and the model answers it, instead of continuing the user's words as its first ``room`` tokens would.
    Token ids, or a request whose other turns alone do not fit: its first ``room`` tokens."""
    ids = render(conv, tokenizer)
    if len(ids) <= room or conv.token_ids is not None:
        return ids[:room]
    msgs = [dict(m) for m in conv.prompt_messages()]
    last = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=None)
    if last is None:
        return ids[:room]
    text, best = msgs[last]["content"], None
    lo, hi = 1, len(text) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        msgs[last]["content"] = text[:mid]
        cand = render(Conversation(messages=msgs), tokenizer)
        if len(cand) <= room:
            best, lo = cand, mid + 1
        else:
            hi = mid - 1
    return best if best is not None else ids[:room]


def _native_starts_with_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer adds BOS to plain text on its own (Llama style), which other templates then keep."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or isinstance(tokenizer, ByteTokenizer):
        return False
    try:
        return list(tokenizer("hi", add_special_tokens=True)["input_ids"])[:1] == [bos]
    except Exception:
        return False
