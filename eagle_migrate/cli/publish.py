from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import COMMANDS, CheckpointArg, CommandOptions, CreatePrOpt, JsonOpt, PrivateOpt, RevisionOpt, options_of
from .render import log, print_json, stdout


def options_model():
    """The command's options model (PublishOptions), imported when the command runs."""
    from ..publish.options import PublishOptions  # lazy: the publish package stays out of --help

    return PublishOptions


COMMANDS["publish"] = CommandOptions(options_model, inputs=("checkpoint",))


def publish(
    checkpoint: CheckpointArg,
    repo_id: Annotated[str, typer.Option("--repo-id", help="Hub repository ORG/NAME (created if missing).", show_default=False)],
    report_dir: Annotated[Optional[Path], typer.Option("--report", help="Folder written by `validate --report DIR` (its report.json must pass).")] = None,
    private: PrivateOpt = False,
    create_pr: CreatePrOpt = False,
    revision: RevisionOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Build the repo folder and print the plan; no network at all (the folder is kept only with --out).")] = False,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Write the repo folder here (default: a temporary folder, removed; a --dry-run without --out writes nothing).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Publish without a passing validation report (the model card says so).")] = False,
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="The target: its hub id, or its local folder (named by its config, never by its path); default: from provenance.json / config.json.")] = None,
    license: Annotated[Optional[str], typer.Option("--license", help="License id for the card (default: from provenance.json or the target's card).")] = None,
    num_speculative_tokens: Annotated[Optional[int], typer.Option("--num-speculative-tokens", "-k", min=1, max=16, help="k in speculative_config.json (default: the report's k, else 3).")] = None,
    json: JsonOpt = False,
) -> None:
    """Upload a validated drafter to the Hub in one commit: weights, config, model card, speculative_config.json.

    The token comes from HF_TOKEN or the stored login (`hf auth login`) and is never printed or written.

    Example: eagle-migrate publish ./out/quantize --repo-id my-org/llama31-8b-eagle3.1 --report ./out/validate --create-pr
    """
    opts = options_of("publish", locals())
    from ..publish.stage import run  # lazy: huggingface_hub and the formats package (--help imports none)

    res = run(checkpoint, opts, progress=None if json else log)
    if json:
        print_json(res)
        return
    for f in res.findings:
        log(f"{f.severity}: {f.message}")
    if res.dry_run:
        head = "dry run: nothing was uploaded" + ("" if res.out_dir else " or written (pass --out DIR to keep the repo folder)")
    else:
        head = f"published to {res.repo_id}"
    stdout.print(f"[bold]{head}[/]", highlight=False)
    from rich.table import Table  # lazy: rich.table loads only when a table is printed (--help stays fast)

    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("file")
    t.add_column("size", justify="right")
    t.add_column("from")
    for f in res.files:
        t.add_row(f.path, f"{f.size:,}", f.source)
    stdout.print(t)
    dest = res.revision or "main"
    where = f"a pull request against {dest}" if res.create_pr else f"branch {dest}"
    stdout.print(
        f"repo {res.repo_id} ({'private' if res.private else 'public'} if created), {where}\n"
        f"commit message: {res.commit_message}\n"
        f"total: {res.total_bytes / 1e6:.2f} MB in {len(res.files)} files",
        highlight=False, markup=False,
    )
    if res.out_dir:
        stdout.print(f"folder: {res.out_dir}", highlight=False, markup=False)
    if res.validation.forced:
        stdout.print(f"validation: NOT passed, published with {res.validation.forced_by} ({res.validation.reason})",
                     highlight=False, markup=False)
    elif res.validation.measured and not res.validation.gates:
        stdout.print("validation: measured, no acceptance gate was set", highlight=False, markup=False)
    if res.pr_url:
        stdout.print(f"pull request: {res.pr_url}", highlight=False, markup=False)
    elif res.commit_url:
        stdout.print(f"commit: {res.commit_url}", highlight=False, markup=False)
    stdout.print(f"serve: {res.vllm_serve}", highlight=False, markup=False)
