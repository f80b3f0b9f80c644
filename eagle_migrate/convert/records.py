"""The calibration records the norm initialisation and the agreement read: the target's aux states on token
sequences (captured one sequence at a time) or a precomputed ``--hidden-states`` folder, split into a statistics set
and a held-out set. Imports: calibration_data (a file of served prompts: its training part), corpora (the one home
of calibration sequences), hidden_states, target."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..calibration_data import is_traffic, traffic_prompts
from ..corpora import calibration_sequences, random_sequences
from ..hidden_states import HiddenRecord, check_last_slice, count_hidden_states, iter_hidden_states
from ..target import LazyTarget

# the statistics pass (norm initialisation + agreement) runs one sequence at a time and needs few: 32 give 94.6 %
# step-0 agreement on the real pair, 64 give 95.2 % (docs/norm-init.md). More --num-sequences feed the calibration
# fine-tune only (on an H100, 6,000 ShareGPT sequences took 5 min in this pass before the cap)
STATS_MAX_SEQUENCES = 256
# on a CPU, 32 (the default --num-sequences): a larger -n feeds the fine-tune, not this pass (256 sequences of 512
# tokens took 10 minutes of a retarget convert on the 2-core box, the fine-tune's whole data set passing one at a time)
STATS_MAX_SEQUENCES_CPU = 32


def stats_sequences(num_sequences: int, device: str) -> int:
    """How many of the ``num_sequences`` calibration sequences the statistics pass reads on ``device``."""
    return min(num_sequences, STATS_MAX_SEQUENCES if str(device).startswith("cuda") else STATS_MAX_SEQUENCES_CPU)


def sequences_for(data: str | None, target: LazyTarget, num_sequences: int, seed: int, max_length: int) -> list[list[int]]:
    """Token-id sequences to estimate statistics on: :func:`eagle_migrate.corpora.calibration_sequences` with the
    target's tokenizer. No ``--data`` and a tokenizer-less (toy) target: random token sequences
    (:func:`eagle_migrate.corpora.random_sequences`, at most 64 tokens) instead of byte-rendered text. A file of served
    prompts: its training part only (:func:`eagle_migrate.calibration_data.traffic_prompts`): the judge's held-out
    prompts shape nothing of the drafter."""
    if is_traffic(data):
        return traffic_prompts(target, data, num_sequences, seed, max_length, 0)[0]
    tok = target.tokenizer
    if data is None and tok is None:
        return random_sequences(target.info.vocab_size, num_sequences, min(max_length, 64), seed)
    return calibration_sequences(data, tok, target.info.vocab_size, num_sequences, max_length, seed)


def records(target: LazyTarget, data: str | None, hidden_states_dir: Path | str | None, aux_ids: list[int], ht: int,
            num_sequences: int, seed: int, max_length: int, want_last: bool) -> tuple[Iterator[HiddenRecord], int]:
    """(iterator over calibration records, how many there will be)."""
    if hidden_states_dir is not None:
        n = min(count_hidden_states(Path(hidden_states_dir)), num_sequences)
        fn = (target.weight("norm", load=False), target.info.rms_norm_eps) if want_last else None
        return iter_hidden_states(Path(hidden_states_dir), aux_ids, ht, limit=n, final_norm=fn,
                                  num_layers=target.info.num_layers), n
    seqs = sequences_for(data, target, num_sequences, seed, max_length)
    return target.capture(seqs, aux_ids, want_last), len(seqs)


def split_stream(it: Iterator[HiddenRecord], n_total: int, n_held: int) -> Iterator[tuple[bool, HiddenRecord]]:
    """(is_held_out, record): every ``n_total // n_held``-th record is held out, up to ``n_held``."""
    every = max(2, n_total // n_held)
    held = 0
    for i, rec in enumerate(it):
        is_h = held < n_held and (i % every == every - 1 or n_total - i <= n_held - held)
        held += is_h
        yield is_h, rec


def hidden_states_evidence(target: LazyTarget, hidden_states_dir: Path | str) -> str | None:
    """The layer evidence of a folder that does not record its layers (speculators-offline): the last slice checked
    through the target's final norm and lm_head, read lazily (:func:`eagle_migrate.hidden_states.check_last_slice`;
    raises DataError when it fails). None for layouts that record their layers or write the post-norm state."""
    norm = (target.weight("norm", load=False), target.info.rms_norm_eps)
    ev = check_last_slice(Path(hidden_states_dir), norm, target.weight("lm_head", mapped=True, load=False))
    return None if ev is None else ev.describe()
