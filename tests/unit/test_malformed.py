"""Malformed and hostile inputs: every one exits 2 with one clear line, no traceback, the input byte-for-byte
untouched, and no code run (the pickle payloads would create a marker file)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_migrate import toy
from eagle_migrate.formats.output import save_safetensors, write_json

from ..layouts import write_layout

MARKER_NAME = "PWNED"


class _Evil:
    """Unpickling this calls os.mkdir(marker): proof that code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _good(tmp: Path, name: str = "good") -> Path:
    return write_layout("vllm-plain", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / name)


def _raw_safetensors(path: Path, header: dict | bytes, data: bytes = b"", length: int | None = None) -> None:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + hb + data)


# Each builder gets tmp_path, returns the path to inspect; the marker (if any) is tmp_path / MARKER_NAME.
def case_truncated(tmp):
    p = _good(tmp)
    f = p / "model.safetensors"
    b = f.read_bytes()
    f.write_bytes(b[: len(b) // 2])
    return p


def case_absurd_header_length(tmp):
    p = tmp / "c"
    p.mkdir()
    _raw_safetensors(p / "model.safetensors", b"{}", length=2**62)
    return p


def case_invalid_header_json(tmp):
    p = tmp / "c"
    p.mkdir()
    _raw_safetensors(p / "model.safetensors", b'{"fc.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]')
    return p


def case_offsets_out_of_range(tmp):
    p = tmp / "c"
    p.mkdir()
    _raw_safetensors(p / "model.safetensors", {"fc.weight": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}}, b"\0" * 64)
    return p


def case_offsets_overlap(tmp):
    p = tmp / "c"
    p.mkdir()
    _raw_safetensors(p / "model.safetensors", {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }, b"\0" * 24)
    return p


def case_bad_config_json(tmp):
    p = _good(tmp)
    (p / "config.json").write_text('{"hidden_size": 64,,}')
    return p


def case_config_not_utf8(tmp):
    p = _good(tmp)
    (p / "config.json").write_bytes(b'{"hidden_size": "\xff\xfe"}')
    return p


def case_non_dict_config(tmp):
    p = _good(tmp)
    (p / "config.json").write_text("[1, 2, 3]")
    return p


def case_config_is_directory(tmp):
    p = _good(tmp)
    (p / "config.json").unlink()
    (p / "config.json").mkdir()
    return p


def case_contradicting_shapes(tmp):
    sd = toy.drafter_state_dict("oracle")
    sd["fc.weight"] = torch.zeros(32, 192)  # H=64 everywhere else
    return write_layout("vllm-plain", toy.drafter_config(), sd, tmp / "c")


def case_attention_input_neither_h_nor_2h(tmp):
    sd = toy.drafter_state_dict("oracle")
    for x in "qkv":
        n = f"layers.0.self_attn.{x}_proj.weight"
        sd[n] = torch.zeros(sd[n].shape[0], 100)
    return write_layout("vllm-plain", toy.drafter_config(), sd, tmp / "c")


def case_pickle_code_zip(tmp):
    p = tmp / "c"
    p.mkdir()
    torch.save({"fc.weight": torch.zeros(2), "x": _Evil(str(tmp / MARKER_NAME))}, p / "pytorch_model.bin")
    return p


def case_pickle_code_legacy(tmp):
    p = tmp / "c"
    p.mkdir()
    with open(p / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": _Evil(str(tmp / MARKER_NAME))}, f)
    return p


def case_pickle_code_legacy_protocol2(tmp):
    p = tmp / "c"
    p.mkdir()
    with open(p / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": _Evil(str(tmp / MARKER_NAME))}, f, protocol=2)
    return p


def case_pickle_code_in_shard(tmp):
    p = _good(tmp)
    torch.save({"extra": _Evil(str(tmp / MARKER_NAME))}, p / "evil.bin")
    (p / "model.safetensors").rename(p / "model-00001-of-00002.safetensors")
    from safetensors import safe_open

    with safe_open(str(p / "model-00001-of-00002.safetensors"), "pt") as f:
        names = list(f.keys())
    wm = {n: "model-00001-of-00002.safetensors" for n in names}
    wm["extra"] = "evil.bin"
    write_json(p / "model.safetensors.index.json", {"weight_map": wm})
    return p


def case_bin_not_tensors(tmp):
    p = tmp / "c"
    p.mkdir()
    torch.save({"fc.weight": [1, 2, 3]}, p / "pytorch_model.bin")
    return p


def case_garbage_bin(tmp):
    p = tmp / "c"
    p.mkdir()
    g = torch.Generator().manual_seed(0)
    (p / "pytorch_model.bin").write_bytes(bytes(torch.randint(0, 256, (4096,), generator=g, dtype=torch.uint8).tolist()))
    return p


def case_missing_shard(tmp):
    p = write_layout("sharded", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    (p / "model-00002-of-00002.safetensors").unlink()
    return p


def case_shard_outside_folder(tmp):
    p = write_layout("sharded", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    (p / "model-00002-of-00002.safetensors").rename(tmp / "outside.safetensors")
    idx = json.loads((p / "model.safetensors.index.json").read_text())
    idx["weight_map"] = {k: ("../outside.safetensors" if v.startswith("model-00002") else v) for k, v in idx["weight_map"].items()}
    write_json(p / "model.safetensors.index.json", idx)
    return p


def case_shard_symlink_escapes(tmp):
    p = write_layout("sharded", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    (p / "model-00002-of-00002.safetensors").rename(tmp / "outside.safetensors")
    os.symlink(tmp / "outside.safetensors", p / "model-00002-of-00002.safetensors")
    return p


def case_index_without_weight_map(tmp):
    p = write_layout("sharded", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    write_json(p / "model.safetensors.index.json", {"weight_map": ["model-00001-of-00002.safetensors"]})
    return p


def case_duplicate_tensor_across_shards(tmp):
    p = write_layout("sharded", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    save_safetensors({"norm.weight": torch.ones(64)}, p / "model-00003-of-00003.safetensors")
    idx = json.loads((p / "model.safetensors.index.json").read_text())
    idx["weight_map"]["norm2"] = "model-00003-of-00003.safetensors"
    write_json(p / "model.safetensors.index.json", idx)
    return p


def case_empty_folder(tmp):
    p = tmp / "c"
    p.mkdir()
    return p


def case_symlink_loop(tmp):
    p = tmp / "loop"
    os.symlink(p, p)
    return p


def case_symlink_loop_weights(tmp):
    p = tmp / "c"
    p.mkdir()
    os.symlink(p / "model.safetensors", p / "model.safetensors")
    return p


def case_zero_byte_file(tmp):
    p = tmp / "c"
    p.mkdir()
    (p / "model.safetensors").write_bytes(b"")
    return p


def case_directory_named_model_safetensors(tmp):
    p = tmp / "c"
    (p / "model.safetensors").mkdir(parents=True)
    return p


def case_no_tensors(tmp):
    p = tmp / "c"
    p.mkdir()
    save_safetensors({}, p / "model.safetensors")
    return p


def case_not_a_drafter(tmp):
    p = tmp / "c"
    p.mkdir()
    save_safetensors({"model.embed_tokens.weight": torch.zeros(8, 4)}, p / "model.safetensors")
    return p


def case_not_weights_file(tmp):
    f = tmp / "README.txt"
    f.write_text("hello")
    return f


def case_nonexistent(tmp):
    return tmp / "does-not-exist"


def case_bad_aux_ids(tmp):
    p = _good(tmp)
    c = json.loads((p / "config.json").read_text())
    c["eagle_aux_hidden_state_layer_ids"] = ["a", None]
    write_json(p / "config.json", c)
    return p


def case_speculators_wrong_type(tmp):
    p = write_layout("speculators", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    c = json.loads((p / "config.json").read_text())
    c["speculators_model_type"] = "medusa"
    write_json(p / "config.json", c)
    return p


def case_speculators_tlc_not_dict(tmp):
    p = write_layout("speculators", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp / "c")
    c = json.loads((p / "config.json").read_text())
    c["transformer_layer_config"] = "llama"
    write_json(p / "config.json", c)
    return p


def case_unreadable_hf_quant_config(tmp):
    p = _good(tmp)
    (p / "hf_quant_config.json").write_text('"just a string"')
    return p


CASES = {n[len("case_"):]: f for n, f in dict(globals()).items() if n.startswith("case_")}


def _snapshot(root: Path) -> dict[str, str]:
    """Hash of every file under ``root`` (symlinks by target, never followed)."""
    out = {}
    base = root if root.is_dir() and not root.is_symlink() else root.parent
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in dirnames + filenames:
            q = Path(dirpath) / name
            rel = str(q.relative_to(base))
            if q.is_symlink():
                out[rel] = "link:" + os.readlink(q)
            elif q.is_file():
                out[rel] = hashlib.sha256(q.read_bytes()).hexdigest()
            elif q.is_dir():
                out[rel] = "dir"
    return out


def test_at_least_fifteen_cases():
    assert len(CASES) >= 15


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_input_exits_2_cleanly(tmp_path, name, capsys, monkeypatch):
    from eagle_migrate import cli

    monkeypatch.delenv("EAGLE_MIGRATE_DEBUG", raising=False)
    work = tmp_path / "w"
    work.mkdir()
    path = CASES[name](work)
    before = _snapshot(work)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:
        cli.main(["inspect", str(path)])
    out, err = capsys.readouterr()
    assert ei.value.code == 2, f"{name}: exit {ei.value.code}\n{out}\n{err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1, err
    assert all(ln.startswith(("error:", "hint:")) for ln in lines), err
    assert "Traceback" not in err and out == ""
    assert _snapshot(work) == before, f"{name}: the input changed"
    assert not (work / MARKER_NAME).exists(), f"{name}: code ran"


@pytest.mark.parametrize("name", ["pickle_code_zip", "pickle_code_legacy", "truncated", "absurd_header_length"])
def test_malformed_in_a_real_process(tmp_path, name):
    """The console script itself: exit 2, one line, no traceback, no code run (also with --json)."""
    work = tmp_path / "w"
    work.mkdir()
    path = CASES[name](work)
    before = _snapshot(work)
    env = {k: v for k, v in os.environ.items() if k != "EAGLE_MIGRATE_DEBUG"}
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "inspect", str(path), "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)  # --json: the failure is the one document on stdout
    assert doc["error"]["code"] in ("CheckpointError", "UnsafeInputError") and doc["error"]["exit_code"] == 2
    assert r.stderr.count("error:") == 1
    assert _snapshot(work) == before
    assert not (work / MARKER_NAME).exists()


@pytest.mark.parametrize("name", ["pickle_code_zip", "pickle_code_legacy_protocol2", "pickle_code_in_shard"])
def test_pickle_refusal_is_reported_as_unsafe(tmp_path, name):
    from eagle_migrate.errors import UnsafeInputError
    from eagle_migrate.formats import read_checkpoint

    p = CASES[name](tmp_path)
    with pytest.raises(UnsafeInputError, match="GLOBAL posix.mkdir"):
        read_checkpoint(p)
    assert not (tmp_path / MARKER_NAME).exists()
