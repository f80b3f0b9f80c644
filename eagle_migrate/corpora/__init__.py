"""Prompt sources -> conversations -> token ids, and the validation suites built from them. One module per job:

* :mod:`.sources`: readers of prompt sources (built-in sets, JSONL / JSON list / ShareGPT / HumanEval / ``hf:``)
  -> :class:`Conversation` (:func:`load_conversations`).
* :mod:`.templates`: chat templates and rendering (:func:`render`, :data:`TEMPLATES`, :data:`SYSTEM_PROMPTS`,
  :data:`SHIFT_VARIANTS`, :class:`ByteTokenizer` for tokenizer-less targets).
* :mod:`.suites`: the validation suites (chat, code, template-shift, long, a prompts file) and
  :func:`prompt_set_hash`; :mod:`.long` builds the long-context suite's prompts.
* :mod:`.sequences`: calibration sequences for convert, quantize and calibrate.
* :mod:`.traffic`: a file of served prompts split into training and held-out prompts (:func:`split_traffic`), the
  one rule of the triage's ``--worst`` files and ``convert --data``.
* :mod:`.drift`: calibration data shaped like serving under drift (long contexts, other templates and system
  prompts, plain chat), disjoint from the texts the validation suites measure on (:func:`drift_sequences`).

Every name callers use is re-exported here (``corpora.suite``, ``from eagle_migrate.corpora import ...``), except
``suites(names, ...)``: ``corpora.suites`` is now the module (the function is ``corpora.suites.suites``).

The data-set lookups :func:`sharegpt_file`, :func:`humaneval_file` and :func:`load_conversations` live in
:mod:`.sources`, where the suites and sequences look them up at call time: a test stubs them there
(``monkeypatch.setattr(corpora.sources, "sharegpt_file", ...)``).
"""

from __future__ import annotations


from . import drift, long, sequences, sources, suites, templates, traffic
from .drift import DRIFT_KINDS, DriftSequence, drift_sequences
from .long import (  # noqa: F401  (used by tests and benchmarks/drift_curve.py)
    CODE_QUESTIONS,
    LONG_BUCKETS,
    LONG_KINDS,
    LONG_QUESTIONS,
    STDLIB_MODULES,
    _bucket_key,
    long_document,
    stdlib_sources,
)
from .sequences import calibration_sequences, random_sequences
from .sources import (
    ANSWERED,
    DATA_DIR,
    Conversation,
    humaneval_file,
    is_answered,
    iter_sharegpt,
    load_conversations,
    sharegpt_file,
)
from .suites import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SIZES,
    SUITE_NAMES,
    Suite,
    prompt_set_hash,
    suite,
)
from .templates import (
    SHIFT_VARIANTS,
    SYSTEM_PROMPTS,
    TEMPLATES,
    ByteTokenizer,
    render,
    render_text,
    render_within,
)
from .traffic import TRAFFIC_HELDOUT, TRAFFIC_MIN_HELDOUT, content_key, heldout_path, split_traffic

__all__ = ["ANSWERED", "CODE_QUESTIONS", "DATA_DIR", "DEFAULT_MAX_TOKENS", "DEFAULT_SIZES", "LONG_BUCKETS", "LONG_KINDS",
           "LONG_QUESTIONS", "SHIFT_VARIANTS", "STDLIB_MODULES", "SUITE_NAMES", "SYSTEM_PROMPTS", "TEMPLATES",
           "ByteTokenizer", "Conversation", "Suite", "calibration_sequences", "humaneval_file", "is_answered", "iter_sharegpt",
           "load_conversations", "long", "long_document", "prompt_set_hash", "random_sequences", "render",
           "render_text", "render_within", "sequences", "sharegpt_file", "sources", "stdlib_sources", "suite", "suites", "templates",
           "TRAFFIC_HELDOUT", "TRAFFIC_MIN_HELDOUT", "content_key", "heldout_path", "split_traffic", "traffic"]
