"""The Hub model card (``README.md``) of a published drafter (its serving commands come from ``serving.py``).

Everything here is a pure function of a ``CardInfo`` (no clock, no network), so a card is reproducible and its
golden test (``tests/golden/README.md``) is exact. Front matter goes through huggingface_hub's ``ModelCardData``:

* ``base_model``: the target (verifier) hub id, so the Hub links the drafter to it;
* ``library_name: vllm``: the weights are not a transformers model (vLLM's EAGLE-3 drafter architectures have no
  transformers class); vLLM is what loads them. ``transformers`` would make the Hub offer snippets that cannot work for a drafter;
* ``tags``: ``speculative-decoding``, ``eagle3``, ``eagle3.1`` (when fc_norm / norm_output are on), ``vllm``,
  ``eagle-migrate`` (+ ``compressed-tensors`` for quantized drafters);
* ``license`` (+ ``license_name`` / ``license_link`` for ``other``) when known.

Imports: pydantic, huggingface_hub (lazily), ``publish.serving``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .serving import (
    TARGET_PLACEHOLDER,
    repo_speculative_config,
    sglang_command,
    vllm_python_snippet,
    vllm_serve_command,
)

EAGLE3_PAPER = "https://arxiv.org/abs/2503.01840"
EAGLE31_PAPER = "https://arxiv.org/abs/2605.09992"


class GateRow(BaseModel):
    name: str
    passed: bool | None = None
    detail: str | None = None


class ValidationInfo(BaseModel):
    """The validation report, reduced to what the card shows."""

    passed: bool | None = Field(None, description="no gate failed (None: the report states no verdict)")
    gated: bool = Field(False, description="the report has gates: only then does the card say they passed")
    gates: list[GateRow] = Field(default_factory=list)
    columns: list[str] = Field(default_factory=list)
    rows: list[list[str]] = Field(default_factory=list)
    legend: str | None = Field(None, description="how to read the table's ± and paired ratio (only when it shows an SE)")
    details: list[tuple[str, str]] = Field(default_factory=list, description="engine, k, temperature, ... as shown")
    images: list[str] = Field(default_factory=list, description="plot paths inside the repo")
    report_path: str | None = Field(None, description="the report's path inside the repo")


class LineageStep(BaseModel):
    """One stage a drafter went through, as the card's lineage table and provenance.json show it."""

    stage: str = Field(..., description="source | convert | quantize | validate")
    summary: str = Field(..., description="one line: what the stage did and its verdict")


class FileRow(BaseModel):
    path: str
    size: int


class CardInfo(BaseModel):
    """Everything the card and the serving snippets are made from."""

    repo_id: str
    target: str | None = Field(None, description="the target's hub id (base_model); None when unknown")
    target_name: str | None = Field(None, description="the target's name when its hub id is unknown: a local folder's own name")
    license: str | None = None
    license_name: str | None = None
    license_link: str | None = None
    format: str = Field("eagle3", description="eagle3 or eagle3.1")
    flags: dict[str, bool] = Field(default_factory=dict)
    sizes: dict[str, int] = Field(default_factory=dict)
    aux_layer_ids: list[int] | None = None
    architecture: str | None = None
    num_parameters: int = 0
    dtype: str | None = None
    quantization: str | None = None
    files: list[FileRow] = Field(default_factory=list)
    lineage: list[LineageStep] = Field(default_factory=list, description="every stage, source first")
    validation: ValidationInfo | None = None
    forced: bool = Field(False, description="published without a passing validation report")
    forced_by: str | None = Field(None, description="the flag that allowed it (--force, or migrate's --no-validate)")
    forced_reason: str | None = Field(None, description="why validation does not pass (when forced)")
    num_speculative_tokens: int = 3
    tool_version: str


# ----- serving snippets ------------------------------------------------------------------------------------------
def target_for_commands(info: CardInfo) -> str:
    return info.target or info.target_name or TARGET_PLACEHOLDER


def spec_config(info: CardInfo) -> dict[str, Any]:
    return repo_speculative_config(info.repo_id, info.num_speculative_tokens)


# ----- the card --------------------------------------------------------------------------------------------------
def card_tags(info: CardInfo) -> list[str]:
    tags = ["speculative-decoding", "eagle3"]
    if info.format == "eagle3.1":
        tags.append("eagle3.1")
    tags += ["vllm", "eagle-migrate"]
    if info.quantization and "compressed-tensors" in info.quantization:
        tags.append("compressed-tensors")
    return tags


def front_matter(info: CardInfo):
    from huggingface_hub import ModelCardData  # lazy: huggingface_hub (0.2 s), only to render a card

    kw: dict[str, Any] = {"library_name": "vllm", "tags": card_tags(info)}
    if info.target:
        kw["base_model"] = info.target
    if info.license:
        kw["license"] = info.license
        if info.license_name:
            kw["license_name"] = info.license_name
        if info.license_link:
            kw["license_link"] = info.license_link
    return ModelCardData(**kw)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} K"
    return str(n)


def fixed(v: float, nd: int = 3, sign: bool = False) -> str:
    """``v`` to ``nd`` decimals, a value that rounds to zero shown as 0 (never "-0.0")."""
    s = f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"
    if float(s) == 0:
        s = f"{0.0:.{nd}f}"
    return s


def scalar_str(v: Any) -> str:
    """A scalar as a card cell shows it (floats to 3 decimals, booleans as yes / no)."""
    if isinstance(v, float):
        return fixed(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _md_link_model(repo_id: str) -> str:
    return f"[{repo_id}](https://huggingface.co/{repo_id})"


def render_body(info: CardInfo) -> str:
    name = info.repo_id.split("/")[-1]
    target = target_for_commands(info)
    spec = spec_config(info)
    k = info.num_speculative_tokens
    gen = "EAGLE-3.1" if info.format == "eagle3.1" else "EAGLE-3"
    out: list[str] = [f"# {name}", ""]

    if info.target:
        tgt = _md_link_model(info.target)
    elif info.target_name:
        tgt = f"the local model `{info.target_name}` (its Hub id was not recorded)"
    else:
        tgt = "its target model (not recorded: see Lineage)"
    out += [
        f"An **{gen}** speculative-decoding drafter ([EAGLE-3]({EAGLE3_PAPER})) for {tgt}. It proposes the next {k} tokens from the target's "
        "hidden states; the target verifies them in one forward pass, so the output is exactly the target's own "
        "while fewer target steps are needed. It does not generate text on its own: serve it next to its target.",
        "",
    ]
    if info.format == "eagle3.1":
        out += [
            f"EAGLE-3.1 ([paper]({EAGLE31_PAPER})) normalises each target hidden state before the drafter's `fc` "
            "(`fc_norm`) and feeds the post-norm state to the next draft step (`norm_output`), which keeps the "
            "acceptance length up on long contexts and unfamiliar chat templates. vLLM (>= 0.22) serves it as "
            "method `eagle3`; the flags are in `config.json`.",
            "",
        ]
    if info.forced:
        out += [_forced_note(info), ""]

    # -- drafter facts
    s = info.sizes
    facts: list[list[str]] = [["format", gen + (" (`fc_norm`, `norm_output`)" if info.format == "eagle3.1" else "")]]
    if info.architecture:
        facts.append(["architecture", f"`{info.architecture}`"])
    if info.target:
        facts.append(["target (verifier)", f"`{info.target}`"])
    elif info.target_name:
        facts.append(["target (verifier)", f"`{info.target_name}` (a local model; Hub id not recorded)"])
    else:
        facts.append(["target (verifier)", "unknown"])
    if info.aux_layer_ids is not None:
        facts.append(["target aux layers", ", ".join(str(i) for i in info.aux_layer_ids)])
    if "hidden_size" in s:
        facts.append(["hidden size", f"{s['hidden_size']} (target {s.get('target_hidden_size', s['hidden_size'])})"])
    if "draft_vocab_size" in s or "vocab_size" in s:
        v, vd = s.get("vocab_size"), s.get("draft_vocab_size", s.get("vocab_size"))
        facts.append(["vocabulary", f"{vd} draft tokens of {v}" + (" (mapped with `d2t`)" if v and vd and vd != v else "")])
    if "num_hidden_layers" in s:
        facts.append(["decoder layers", str(s["num_hidden_layers"])])
    on = [f"`{k_}`" for k_, v_ in info.flags.items() if v_]
    facts.append(["flags", ", ".join(on) if on else "none"])
    facts.append(["parameters", _human_count(info.num_parameters)])
    if info.dtype:
        facts.append(["dtype", info.dtype])
    facts.append(["quantization", info.quantization or "none"])
    out += ["## Drafter", "", _table(["", ""], facts), ""]

    # -- usage
    out += [
        "## Usage",
        "",
        f"### vLLM (>= 0.22, method `eagle3`, k = {k})",
        "",
        "```bash",
        vllm_serve_command(target, spec),
        "```",
        "",
        "`speculative_config.json` in this repository holds the same dictionary. In Python:",
        "",
        "```python",
        vllm_python_snippet(target, spec).rstrip("\n"),
        "```",
        "",
        "### SGLang",
        "",
        "```bash",
        sglang_command(target, info.repo_id, k),
        "```",
        "",
        f"SGLang counts the verified token too (`--speculative-num-draft-tokens` = steps + 1 = {k + 1} for a "
        "chain): compare acceptance lengths across engines only at the same number of draft steps.",
        "",
    ]
    if not info.target and info.target_name:
        out += [f"`{info.target_name}` is the local target this drafter was made for: use that model's path or Hub id.", ""]
    elif not info.target:
        out += [f"Replace `{TARGET_PLACEHOLDER}` with the target model this drafter was made for.", ""]

    # -- validation
    out += _validation_section(info)

    # -- lineage
    out += ["## Lineage", "", f"Made with eagle-migrate {info.tool_version}."]
    if info.lineage:
        out += ["", _table(["stage", "what happened"], [[st.stage, st.summary] for st in info.lineage])]
    else:
        out += ["", "No record of the earlier stages came with the checkpoint."]
    out += ["", "`provenance.json` holds the full record of every stage and the publish details, with the sha256 of the "
            "weights.", ""]

    # -- files
    out += ["## Files", "", _table(["file", "size"], [[f"`{f.path}`", _human_bytes(f.size)] for f in info.files]), ""]

    # -- license
    out += ["## License", ""]
    if info.license:
        lic = info.license_name or info.license
        link = f" ({info.license_link})" if info.license_link else ""
        out += [f"`{lic}`{link}, carried over from the target / source drafter.", ""]
    else:
        out += ["Not recorded. A drafter trained on a model's outputs usually falls under that model's license.", ""]
    return "\n".join(out)


def _validation_section(info: CardInfo) -> list[str]:
    """The card's "Validation" section: the verdict, how it was measured, the suite table (AL ± SE, the paired ratio
    ± SE and its verdict where the report has them) and its legend, the gates, the plots, the report's path."""
    out = ["## Validation", ""]
    v = info.validation
    if v is None:
        return out + ["No validation report was published with this drafter"
                      + (f" (`{info.forced_by}`): its acceptance length was not measured." if info.forced_by else "."), ""]
    if v.passed is True and v.gated:
        verdict = f"{'the gate' if len(v.gates) == 1 else f'all {len(v.gates)} gates'} passed"
    elif v.passed is True:
        verdict = "measured only: no acceptance gate was set"
    else:
        verdict = {False: "gates did not pass", None: "no verdict recorded"}[v.passed]
    out += [f"Acceptance length (AL = 1 + accepted draft tokens per draft step) measured by eagle-migrate; {verdict}.", ""]
    if v.details:
        out += [", ".join(f"{a}: {b}" for a, b in v.details) + ".", ""]
    if v.rows:
        out += [_table(v.columns, v.rows), ""]
    if v.legend:
        out += [v.legend, ""]
    if v.gates:
        gate_rows = [[g.name, {True: "pass", False: "FAIL", None: "?"}[g.passed], g.detail or ""] for g in v.gates]
        out += [_table(["gate", "result", "detail"], gate_rows), ""]
    for img in v.images:
        out += [f"![{img.rsplit('/', 1)[-1].rsplit('.', 1)[0]}]({img})", ""]
    if v.report_path:
        out += [f"The full report is in [`{v.report_path}`]({v.report_path}).", ""]
    return out


def _forced_note(info: CardInfo) -> str:
    """The card's warning for a drafter published without a passing validation, naming the flag actually passed."""
    flag = info.forced_by or "--force"
    if info.validation is None and flag == "--no-validate":
        return ("> **Not validated:** published with `--no-validate`, so its acceptance length was never measured. "
                "Measure it (`eagle-migrate validate`) before relying on it.")
    why = f" ({info.forced_reason})" if info.forced_reason else ""
    return (f"> **Warning:** published with `{flag}` without a passing validation{why}. "
            "Measure its acceptance length (`eagle-migrate validate`) before relying on it.")


def render_card(info: CardInfo) -> str:
    """The full ``README.md``: YAML front matter (huggingface_hub ``ModelCardData``) + body."""
    from huggingface_hub import ModelCard  # lazy: huggingface_hub (0.2 s), only to render a card

    card = ModelCard(f"---\n{front_matter(info).to_yaml()}\n---\n\n{render_body(info)}")
    return str(card)
