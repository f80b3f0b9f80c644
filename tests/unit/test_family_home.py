"""Each drafter family has one home, eagle_migrate/families/ (issue #39): no family name outside it, a registry that
refuses what it cannot honour, and the recipe of docs/extending.md ("Add a drafter family"), run as written, adds a
family that goes through read -> convert -> write -> read back."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from eagle_migrate import families, toy
from eagle_migrate.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "eagle_migrate"

# the names of the built-in families (and of the models they serve: Kimi K2 is an MLA target) and of their own tensors
# and config keys; `k_norm` / `q_norm` only as words (`_check_norm` is not one); `llama` as a name, not in `llama3`
# (a rope type, a chat template, SpecForge's file name), `Llama-3.1` / `meta-llama/` (a model) or `Llama-style`
FAMILY_NAMES = re.compile(r"(?i:qwen3|deepseek|mla|kimi|(?<!meta-)llama(?![-\d]))|kv_lora|q_lora|qk_norm"
                          r"|(?<![A-Za-z])[qk]_norm")
# Files outside families/ that may still say one, and why. Each is limited to the names it needs; an entry that no
# longer matches anything fails the test (so the list only shrinks).
EXCEPTIONS: dict[str, tuple[re.Pattern, str]] = {
    "toy.py": (re.compile(r"(?i:llama|qwen3|mla|deepseek)|kv_lora|q_lora|qk_norm"),
               "the toy world's rows per family (TOY, keyed by family name: geometry, target, attention weights, "
               "norms): the production family modules know nothing of the toy world (issue 52)"),
    "demo.py": (re.compile(r"(?i:llama)"), "the demo says what its toy target is: a transformers Llama model"),
    "formats/aux_ids.py": (re.compile(r"(?i:llama)"), "cites the vLLM source file whose decoder loops capture the "
                           "aux states (models/llama.py): a file name, not a family"),
    "formats/torchspec.py": (re.compile(r"(?i:kimi)"), "TorchSpec's own rule: its --vllm exporter shifts aux ids for "
                             "a target of model_type kimi_k2 only (a producer's behaviour, not a drafter family)"),
    "formats/vllm_read.py": (re.compile(r"(?i:kimi)"), "the TorchSpec rule above, in a reading's evidence text"),
    "formats/modelopt.py": (re.compile(r"(?i:llama|kimi)"), "ModelOpt's export template as ModelOpt writes it"),
    "formats/specforge.py": (re.compile(r"(?i:llama)"), "the architecture SpecForge writes, in the layout's description"),
    "formats/safeailab.py": (re.compile(r"(?i:llama)"), "the architecture SafeAILab's configs say, as they say it"),
    "corpora/templates.py": (re.compile(r"(?i:llama)"), "'Llama style': a tokenizer's BOS convention, not a family"),
    "engines/server_tokenizer.py": (re.compile(r"(?i:llama)"), "'Llama style' BOS, as corpora/templates.py"),
    "engines/attention_backend.py": (re.compile(r"(?i:mla|deepseek|kimi)"), "vLLM's CPU attention backends for MLA "
                                      "models (CPU_MLA / AMX_MLA are vLLM's names; DeepSeek-V3 / Kimi K2 are the "
                                      "models that need them); which config needs one is the family's "
                                      "(Family.vllm_cpu_attention). In the validate-engine area of a concurrent "
                                      "refactor: the backend pair can move to the family after that lands"),
    "engines/vllm_engine.py": (re.compile(r"(?i:mla)"), "attention_backend.is_mla, as above"),
    "engines/in_process.py": (re.compile(r"(?i:mla)"), "documents --attention-backend, whose values are vLLM's MLA backends"),
    "validate/api.py": (re.compile(r"(?i:mla)"), "documents --attention-backend, whose values are vLLM's MLA backends"),
    "cli/validate.py": (re.compile(r"(?i:mla)"), "the --attention-backend help: its values are vLLM's MLA backends"),
}


def _outside_families() -> dict[str, list[str]]:
    """``relative path -> lines`` naming a family, outside families/, less what EXCEPTIONS allows."""
    found: dict[str, list[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel.startswith("families/"):
            continue
        allowed = EXCEPTIONS.get(rel, (None, ""))[0]
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            names = FAMILY_NAMES.findall(line)
            if allowed is not None:
                names = [x for x in names if not allowed.fullmatch(x)]
            if names:
                found.setdefault(rel, []).append(f"{n}: {line.strip()}")
    return found


def test_family_names_live_in_families_only():
    assert _outside_families() == {}, "a family name outside eagle_migrate/families/ (ask the family instead)"


def test_the_exceptions_are_needed():
    for rel, (allowed, _) in EXCEPTIONS.items():
        text = (PKG / rel).read_text(encoding="utf-8")
        assert any(allowed.fullmatch(x) for x in FAMILY_NAMES.findall(text)), f"{rel} no longer needs its exception"


def test_the_name_check_finds_a_family_name():
    assert FAMILY_NAMES.findall("if cfg.architecture == 'qwen3' or 'kv_lora_rank' in d: Eagle3DeepseekV2") == \
        ["qwen3", "kv_lora", "Deepseek"]
    assert FAMILY_NAMES.findall("self.q_norm(q); _check_norm_weights(ck); qk_norm_weights_missing; cfg.mla") == \
        ["q_norm", "qk_norm", "mla"]
    assert FAMILY_NAMES.findall("arch == 'llama' or LlamaForCausalLMEagle3; model_type == 'kimi_k2'") == \
        ["llama", "Llama", "kimi"]
    assert FAMILY_NAMES.findall("rope llama3, template llama3, meta-llama/Llama-3.1-8B, Llama-style, llama31") == []


def test_families_import_only_the_base_layer():
    """families/ sits below drafter, formats and quant (which ask it): it imports only errors among the package's
    modules, besides itself (torch, where it builds modules, inside the function)."""
    bad = []
    for p in sorted((PKG / "families").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                mod = node.module or ""
                if node.level == 2 and mod != "errors" or node.level > 2:
                    bad.append(f"{p.name}: from {'.' * node.level}{mod}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad += [f"{p.name}: {n}" for n in names if n.startswith("eagle_migrate")]
    assert bad == []


def test_the_family_modules_know_nothing_of_the_toy_world():
    """The toy world's rows per family are toy.py's (TOY, keyed by family name), not the production modules' (#52)."""
    hits = [f"{p.name}:{n}" for p in sorted((PKG / "families").glob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if re.search(r"(?i)toy", line)]
    assert hits == []
    assert tuple(toy.TOY) == families.names()


def test_the_toy_world_refuses_a_layer_of_its_own_without_a_row(monkeypatch):
    """A family whose behaviour is Family's gets the default family's toy (the recipe's example); one with a layer of
    its own needs its row of toy.TOY."""
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))

    class OwnLayer(families.Family):
        pass

    families.register(families.Family(dataclasses.replace(families.DEFAULT.row, name="plain")))
    families.register(OwnLayer(dataclasses.replace(families.DEFAULT.row, name="own")))
    assert toy.toy_row("plain") is toy.TOY[families.DEFAULT.name]
    with pytest.raises(UnsupportedError, match="no toy world for the own family"):
        toy.drafter_config(family="own")


# ----- the registry -------------------------------------------------------------------------------------------------
def test_registry_lookup():
    assert families.names() == ("llama", "qwen3", "mla") and families.DEFAULT is families.get("llama")
    assert families.find("gpt9") is None
    with pytest.raises(UnsupportedError, match="no drafter family 'gpt9'"):
        families.get("gpt9")
    assert families.names_text() == "llama, qwen3 or mla"


def test_registry_refuses_a_second_family_of_a_name_and_late_fields(monkeypatch):
    from eagle_migrate.drafter.config import DrafterConfig
    from eagle_migrate.formats.traps import TRAPS  # the trap table, built from the registry

    assert "q_lora_rank" in DrafterConfig.model_fields and "mla_size_mismatch" in TRAPS  # the families' own
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))
    with pytest.raises(ValueError, match="already registered"):
        families.register(families.get("qwen3"))

    base = families.DEFAULT.row
    late = families.Family(dataclasses.replace(base, name="late", config_fields={"late_rank": (int | None, None)}))
    with pytest.raises(ValueError, match="after they were built"):  # DrafterConfig has no late_rank field
        families.register(late)

    late_traps = families.Family(dataclasses.replace(base, name="late-traps",
                                                     traps=(("late_trap", "error", "a trap the table has no row for", ()),)))
    with pytest.raises(ValueError, match="trap rows after they were built"):
        families.register(late_traps)
    assert "late" not in families.names() and "late-traps" not in families.names()


def test_detect_decides_evidence_first():
    """MLA projections claim the weights; Qwen3's q/k norms are evidence; else the config as vLLM reads it."""
    llama_names = ["layers.0.self_attn.q_proj.weight"]
    f, ev, cf = families.detect(llama_names + ["layers.0.self_attn.kv_a_proj_with_mqa.weight"], {}, "vllm")
    assert f.name == "mla" and ev is None
    f, ev, cf = families.detect(llama_names + ["layers.1.self_attn.k_norm.weight"], {"architectures": ["LlamaForCausalLM"]}, "vllm")
    assert f.name == "qwen3" and ev == {(1, "k")} and cf == ("llama", "architectures LlamaForCausalLM")
    assert families.detect(llama_names, {"model_type": "qwen3"}, "speculators")[0].name == "qwen3"
    assert families.detect(llama_names, {}, "speculators")[2] == ("llama", "transformer_layer_config.model_type (none: llama)")
    assert families.detect(llama_names, {"model_type": "mistral"}, "vllm")[0:3:2] == (families.DEFAULT, (None, ""))


# ----- the recipe ---------------------------------------------------------------------------------------------------
def _recipe_blocks() -> list[str]:
    """The code blocks of docs/extending.md's section "Add a drafter family"."""
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    body = text.split("\n## Add a drafter family\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


@pytest.fixture
def example_family(monkeypatch):
    """The family of docs/extending.md ("Add a drafter family"), its code blocks run as written (the module, then the
    registry line with the registry's ``register``), registered for this test only."""
    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))
    blocks = _recipe_blocks()
    assert len(blocks) == 2
    ns: dict = {"__name__": "eagle_migrate.families.example", "register": families.register}
    for b in blocks:
        exec(compile(b, "docs/extending.md", "exec"), ns)  # noqa: S102 (the recipe, run as written)
    return ns["EXAMPLE"]


def test_the_recipe_adds_a_family_that_round_trips(tmp_path, example_family):
    from eagle_migrate.convert import convert
    from eagle_migrate.formats import read_checkpoint, write_checkpoint
    from eagle_migrate.loader import load_drafter
    from eagle_migrate.target import load_target

    assert families.get("example") is example_family and "example" in families.names()
    src = toy.write_drafter(tmp_path / "src", "oracle", family="example")
    assert json.loads((src / "config.json").read_text())["architectures"] == ["Eagle3ExampleForCausalLM"]
    ck = read_checkpoint(src)
    assert ck.config.architecture == "example" and ck.format == "eagle3"
    assert not [f for f in ck.findings if f.severity == "error"], ck.findings
    target = toy.write_target(tmp_path / "target")  # a Llama target: the example layer is the Llama one
    out = tmp_path / "out"
    convert(src, str(target), out, num_sequences=8, command="test", calibrate=False)
    back = read_checkpoint(out)
    assert back.config.architecture == "example" and back.format == "eagle3.1"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3ExampleForCausalLM"] and cfg["model_type"] == "example"
    assert not [f for f in back.findings if f.severity == "error"], back.findings
    # written again (the speculators layout: the family's plain model names) and read back
    spec = write_checkpoint(back, tmp_path / "spec", "speculators")
    tlc = json.loads((spec / "config.json").read_text())["transformer_layer_config"]
    assert tlc["architectures"] == ["ExampleForCausalLM"] and tlc["model_type"] == "example"
    assert read_checkpoint(spec).config.architecture == "example"
    # the converted drafter is the oracle: it drafts the successors
    t = load_target(str(target), with_tokenizer=False)
    seq = torch.tensor([[5, 9, 10, 11]])
    aux, _ = t.forward(seq[:, :-1], toy.AUX_IDS)
    assert load_drafter(out, t).draft(seq, aux, 3).tolist() == [[12, 13, 14]]
