from __future__ import annotations

from typing import Annotated

import typer

from ..errors import EXIT_CHECK_FAILED
from .options import (
    COMMANDS,
    AuxIdsConventionOpt,
    CheckpointArg,
    CommandOptions,
    DeviceOpt,
    JsonOpt,
    TargetOpt,
    TrainedForOpt,
)
from .render import evidence_rows, print_json, stdout

DeepOpt = Annotated[bool, typer.Option("--deep", help="Check every tensor for NaN/Inf (reads all weights; default: norms and small tensors).")]


# five options, passed straight to the library function: its keyword parameters are their one declaration
def options_model():
    """The library function the command's options go to (inspect_checkpoint), imported when the command runs."""
    from ..inspection import inspect_checkpoint  # lazy: the checkpoint readers (formats/) stay out of --help

    return inspect_checkpoint


COMMANDS["inspect"] = CommandOptions(options_model, inputs=("ckpt",))


def inspect(ckpt: CheckpointArg, target: TargetOpt = None, deep: DeepOpt = False, aux_ids_convention: AuxIdsConventionOpt = None,
            device: DeviceOpt = "auto", trained_for: TrainedForOpt = None, json: JsonOpt = False) -> None:
    """What a drafter checkpoint is (format, producer, sizes, aux ids, flags) and every trap vLLM would hit.

    Reads any layout: SafeAILab EAGLE-1/2/3, SpecForge, speculators, ModelOpt, TorchSpec, vLLM, sharded or not.
    The input is never modified; safetensors are read through their headers only. With --target, stored aux layer
    ids that can be read two ways and carry no deciding fingerprint are measured on the target (it is loaded); an
    inconclusive measurement is a warning that names both readings and --aux-ids-convention. With --target it also
    says whether the drafter fits that target: the target its config names, and its step-0 agreement with the
    target's greedy next token on the target's own text (seconds on a small target), against --trained-for's when
    given, else a fixed threshold.

    Exit codes: 0 no error finding, 1 a finding of severity error, 2 unreadable input.

    Example: eagle-migrate inspect ./EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
    """
    from ..inspection import inspect_checkpoint  # lazy: the checkpoint readers (formats/) stay out of --help

    report = inspect_checkpoint(ckpt, target=target, deep=deep, device=device,
                                aux_ids_convention=aux_ids_convention, trained_for=trained_for)
    if json:
        print_json(report)
    else:
        render_report(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def render_report(r) -> None:
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    s = r.sizes
    t = Table(title=f"{r.path}", show_header=False, title_justify="left", expand=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    t.add_row("format", f"{r.format}  ({r.architecture})")
    t.add_row("producer / layout", f"{r.producer} / {r.layout}")
    t.add_row("H / Ht / K", f"{s.hidden_size} / {s.target_hidden_size} / {s.num_aux}")
    t.add_row("V / Vd", f"{s.vocab_size} / {s.draft_vocab_size}")
    t.add_row("I / heads / kv heads / head_dim", f"{s.intermediate_size} / {s.num_attention_heads} / {s.num_key_value_heads} / {s.head_dim}")
    t.add_row("layers", str(s.num_layers))
    ids = "none" if r.aux_layer_ids is None else str(r.aux_layer_ids)
    if r.aux_layer_ids_stored is not None and (r.aux_layer_ids_stored != r.aux_layer_ids or r.aux_layer_ids_convention != "vllm"):
        how = r.aux_ids_evidence.decided_by if r.aux_ids_evidence is not None else ""
        ids += f"  (stored {r.aux_layer_ids_stored}, {r.aux_layer_ids_convention}" + (f" by {how}" if how != "undecided" else ": read literally") + ")"
    t.add_row("aux layer ids (vLLM)", ids)
    for k, v in evidence_rows(r.aux_ids_evidence):
        t.add_row(k, v)
    f = r.flags
    t.add_row("flags", f"fc_norm={f.fc_norm} norm_output={f.norm_output} norm_before_fc={f.norm_before_fc} norm_before_residual={f.norm_before_residual}")
    t.add_row("rope", f"theta={r.rope_theta:g} scaling={r.rope_scaling} max_pos={r.max_position_embeddings}")
    t.add_row("dtype / parameters", f"{r.dtype} / {r.num_parameters:,} in {r.num_tensors} tensors")
    t.add_row("files", ", ".join(f"{x.name} ({_size(x.bytes)})" for x in r.files))
    t.add_row("quantization", "none" if not r.quantization else str(r.quantization.get("scheme")))
    if r.target is not None:
        tg = r.target
        t.add_row("target", f"{tg.path}: H={tg.hidden_size} layers={tg.num_layers} V={tg.vocab_size} max_pos={tg.max_position_embeddings} theta={tg.rope_theta:g}")
    if r.target_fit is not None:
        t.add_row("target fit", f"{r.target_fit.verdict}: {r.target_fit.message}")
    stdout.print(t)
    if not r.findings:
        stdout.print("[green]no findings[/]")
        return
    ft = Table(show_header=True, header_style="bold", expand=False)
    ft.add_column("severity")
    ft.add_column("code")
    ft.add_column("message", overflow="fold")
    colors = {"error": "red", "warning": "yellow", "info": "dim"}
    for x in r.findings:
        ft.add_row(f"[{colors[x.severity]}]{x.severity}[/]", x.code, x.message)
    stdout.print(ft)
    n_err = len(r.errors)
    stdout.print(f"[red]{n_err} error(s)[/]" if n_err else "[green]no errors[/]")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
