"""benchmarks/strong_source_cpu.py (issue 25): its stages resume by content. A regenerated shard whose text no
longer matches its recorded sha256 is made again, captured states made from other text are captured again, and
training batches respect the token budget while covering every sequence exactly once."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ss():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("strong_source_cpu", ROOT / "benchmarks" / "strong_source_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_token_batches_cover_every_sequence_once_within_budget(ss):
    lengths = [5, 300, 17, 64, 64, 1000, 2, 250, 128, 33]
    batches = ss.token_batches(lengths, 512)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 512
    assert [5] in batches  # 1,000 tokens: alone, never dropped


def test_regenerated_shard_is_redone_when_its_text_changed(ss, tmp_path):
    rows = [{"record": 7, "prompt": [1, 2, 3], "output": [4, 5]}, {"record": 9, "prompt": [1], "output": [6]}]
    meta = ss.write_regen_shard(tmp_path, 0, rows, {"records": [7, 10]})
    assert meta["output_tokens"] == 3 and meta["sequences"] == 2
    assert ss.regen_shard_ok(tmp_path, 0) == meta["sha256"]
    assert ss.read_regen(tmp_path, 0) == rows
    assert ss.regen_shard_ok(tmp_path, 1) is None  # never made
    f = tmp_path / "shard-00000.jsonl"
    f.write_text(f.read_text().replace("[4, 5]", "[4, 8]"))
    assert ss.regen_shard_ok(tmp_path, 0) is None


def test_captured_shard_is_stale_when_made_from_other_text(ss, tmp_path):
    a = ss.parse(["--work", str(tmp_path), "--state", str(tmp_path / "state")])
    d = ss.feats_dir(a) / "shard-00003"
    d.mkdir(parents=True)
    (d / "batch-00000.safetensors").write_bytes(b"x")
    (d / "done.json").write_text(json.dumps({"regen_sha256": "aaa", "batches": [{"file": "batch-00000.safetensors"}]}))
    assert ss.captured(a, 3, "aaa") is not None
    assert ss.captured(a, 3, "bbb") is None
    (d / "batch-00000.safetensors").unlink()
    assert ss.captured(a, 3, "aaa") is None  # a batch file lost


def test_settings_name_the_work_folders(ss, tmp_path):
    a = ss.parse(["--work", str(tmp_path)])
    b = ss.parse(["--work", str(tmp_path), "--max-new", str(ss.parse([]).max_new * 2)])
    assert ss.regen_dir(a) != ss.regen_dir(b)  # answers of another length never mix into the same shards
    assert ss.feats_dir(a) != ss.feats_dir(ss.parse(["--work", str(tmp_path), "--batch-tokens", "2048"]))


def test_curve_table_shows_simulated_and_served_rows(ss, tmp_path):
    rows = [{"kind": "simulated", "step": 32, "tokens": 68783, "stored_tokens": 14836, "sim_al": 1.1453, "sim_se": 0.008,
             "per_position": [0.1285, 0.0158, 0.0004], "wall_min": 27.0, "cpu_min": 10.2, "utc": "2026-11-26 13:14:47"},
            {"kind": "served", "step": 32, "tokens": 68783, "served_al": 1.21, "served_se": 0.02, "drafts": 900,
             "utc": "2026-11-26 13:30:00"}]
    (tmp_path / "curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ss.curve_table(tmp_path).splitlines()
    assert len(lines) == 4
    assert "68,783" in lines[2] and "1.145 +- 0.008" in lines[2] and "0.129 / 0.016 / 0.000" in lines[2]
    assert "1.210 +- 0.020 (900)" in lines[3]


def test_regenerated_answers_become_speculators_rows(tmp_path):
    """The target's own answers as speculators' rows: prompt + answer cut at seq_len, loss on the answer only,
    rows with < 16 answer tokens left out, record order, stop at the loss-token cap."""
    spec = importlib.util.spec_from_file_location("speculators_smollm2_prep", ROOT / "benchmarks" / "speculators_smollm2_prep.py")
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    regen = tmp_path / "regen"
    regen.mkdir()
    shard1 = [{"record": 7, "prompt": list(range(10)), "output": list(range(100, 140))},      # 30 kept of 40
              {"record": 9, "prompt": list(range(36)), "output": list(range(100, 120))}]      # 4 answer tokens: out
    shard0 = [{"record": 3, "prompt": list(range(5)), "output": list(range(200, 220))}]
    (regen / "shard-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard1))
    (regen / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard0))

    def run(loss_tokens):
        out = tmp_path / f"rows-{loss_tokens}.jsonl"
        prep.make_data(prep.argparse.Namespace(regen=str(regen), out=str(out), n=100, seq_len=40, loss_tokens=loss_tokens))
        return [json.loads(x) for x in out.read_text().splitlines()]

    rows = run(0)
    assert [r["input_ids"][:5] for r in rows] == [list(range(5)), list(range(5))]   # record 3, then 7
    assert rows[0]["input_ids"] == list(range(5)) + list(range(200, 220))
    assert rows[0]["loss_mask"] == [0] * 5 + [1] * 20
    assert len(rows[1]["input_ids"]) == 40 and rows[1]["loss_mask"] == [0] * 10 + [1] * 30
    assert len(run(15)) == 1                                                         # 20 loss tokens reach 15


def test_best_source_packs_without_embedding_and_unpacks_tensor_for_tensor(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file, save_file

    spec = importlib.util.spec_from_file_location("strong_source_best", ROOT / "benchmarks" / "strong_source_best.py")
    best = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(best)
    g = torch.Generator().manual_seed(0)
    target_emb = torch.randn(32, 8, generator=g)                       # the target's fp32 embedding
    monkeypatch.setattr(best, "_target_embedding", lambda dtype: ("toy-target", target_emb.to(dtype)))
    src = tmp_path / "src"
    src.mkdir()
    w = {"embed_tokens.weight": target_emb.to(torch.bfloat16), "fc.weight": torch.randn(8, 24, generator=g).to(torch.bfloat16),
         "d2t": torch.arange(16)}
    save_file(w, str(src / "model.safetensors"))
    (src / "config.json").write_text('{"speculators_model_type": "eagle3"}')
    state = tmp_path / "state"
    best.pack(src, state)
    assert "embed_tokens.weight" not in load_file(str(state / "model.safetensors"))
    out = best.unpack(tmp_path / "out", state, force=False)
    back = load_file(str(out / "model.safetensors"))
    assert set(back) == set(w) and all(torch.equal(back[k], w[k]) for k in w)
    assert (out / "config.json").read_text() == (src / "config.json").read_text()
    with pytest.raises(SystemExit, match="exists"):
        best.unpack(out, state, force=False)
    with pytest.raises(SystemExit, match="overlaps the input"):                     # nor the committed folder, --force included
        best.unpack(state / "inner", state, force=True)
    assert (state / "model.safetensors").exists()
    # a stored tensor changed after packing: refused
    t = load_file(str(state / "model.safetensors"))
    t["fc.weight"] = t["fc.weight"] + 1
    save_file(t, str(state / "model.safetensors"))
    with pytest.raises(SystemExit, match="differ from provenance"):
        best.unpack(tmp_path / "out2", state, force=False)
    # an embedding that is not the target's is never dropped
    w["embed_tokens.weight"] = w["embed_tokens.weight"] + 1
    save_file(w, str(src / "model.safetensors"))
    with pytest.raises(SystemExit, match="not the target's"):
        best.pack(src, tmp_path / "state2")
    assert not (tmp_path / "state2").exists()
    with pytest.raises(SystemExit, match="overlaps the input"):                     # never replaces its own input
        best.pack(src, tmp_path)
    assert (src / "model.safetensors").exists()
