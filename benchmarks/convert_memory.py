"""Peak memory of `convert` on a synthetic drafter of Llama-3.1-8B shape (H = Ht = 4096, I = 14336, 32/8 heads,
K = 3, V = 128256, Vd = 32000, bf16, no embed_tokens), written to /tmp.

Each measurement runs in a fresh Python process (``ru_maxrss`` is a high-water mark) and prints one JSON line:

* ``baseline``: imports only (torch, eagle_migrate);
* ``passthrough``: the same drafter already in EAGLE-3.1 re-written (pure structural streaming: one tensor at a time
  from the memory-mapped source into the output file);
* ``convert-structural``: EAGLE-3 -> EAGLE-3.1 with the statistics pass on precomputed hidden states
  (``--hidden-states``, 16 sequences x 256 tokens) and ``evaluate=False`` (no lm_head in memory, no agreement runs);
* ``convert-full``: the same with the held-out agreement (source drafter incl. lm_head in memory once).

Usage: python benchmarks/convert_memory.py [--workdir /tmp/em-bench] [--dtype bfloat16]
Results: docs/benchmarks.md, section "convert".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

H, I, NH, NKV, HD, V, VD, L, K = 4096, 14336, 32, 8, 128, 128256, 32000, 32, 3
IDS = [2, 16, 29]


def build(work: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from eagle_migrate.drafter import DrafterConfig
    from eagle_migrate.formats.vllm import vllm_config_dict
    from eagle_migrate.hidden_states import HiddenRecord, write_hidden_states

    work.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, num_aux=K, vocab_size=V, draft_vocab_size=VD, intermediate_size=I,
                        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, rms_norm_eps=1e-5, rope_theta=500000.0,
                        max_position_embeddings=131072, aux_layer_ids=IDS)
    sd = {"fc.weight": r(H, K * H), "lm_head.weight": r(VD, H), "norm.weight": torch.ones(H, dtype=torch.bfloat16),
          "d2t": torch.arange(VD, dtype=torch.int64) * 3 - torch.arange(VD, dtype=torch.int64)}
    p = "layers.0."
    sd.update({p + "self_attn.q_proj.weight": r(NH * HD, 2 * H), p + "self_attn.k_proj.weight": r(NKV * HD, 2 * H),
               p + "self_attn.v_proj.weight": r(NKV * HD, 2 * H), p + "self_attn.o_proj.weight": r(H, NH * HD),
               p + "mlp.gate_proj.weight": r(I, H), p + "mlp.up_proj.weight": r(I, H), p + "mlp.down_proj.weight": r(H, I)})
    for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        sd[p + n + ".weight"] = torch.ones(H, dtype=torch.bfloat16)
    src = work / "drafter"
    src.mkdir(exist_ok=True)
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(vllm_config_dict(cfg)))
    # the same drafter as EAGLE-3.1 (pass-through input)
    s31 = work / "drafter31"
    s31.mkdir(exist_ok=True)
    for k in range(K):
        sd[f"fc_norm.{k}.weight"] = torch.ones(H, dtype=torch.bfloat16)
    save_file(sd, str(s31 / "model.safetensors"), metadata={"format": "pt"})
    (s31 / "config.json").write_text(json.dumps(vllm_config_dict(cfg.model_copy(update={"fc_norm": True, "norm_output": True}))))
    del sd
    # target: config + embedding only (the drafter shares it; no decoder weights are needed with --hidden-states)
    tgt = work / "target"
    tgt.mkdir(exist_ok=True)
    (tgt / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
        "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "vocab_size": V,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}))
    save_file({"model.embed_tokens.weight": r(V, H)}, str(tgt / "model.safetensors"), metadata={"format": "pt"})
    # precomputed aux hidden states: layer scales 3, 8, 25 with a huge position 0 (as measured on real models)
    recs = []
    for i in range(16):
        t = 256
        aux = torch.cat([torch.randn(t, H, generator=g) * s for s in (3.0, 8.0, 25.0)], -1)
        aux[0] *= 100
        recs.append(HiddenRecord(torch.randint(0, V, (t,), generator=g), aux.to(torch.bfloat16)))
    write_hidden_states(work / "hidden", recs, IDS, batch=4)


def _vm_hwm_mib() -> float:
    """Peak resident set of THIS process image (VmHWM; ru_maxrss would include the parent's peak across fork+exec)."""
    for ln in Path("/proc/self/status").read_text().splitlines():
        if ln.startswith("VmHWM:"):
            return int(ln.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _RssSampler:
    """Peaks of RssAnon (working memory) and RssFile (mapped file pages: the memory-mapped checkpoints' pages that
    were read, clean and reclaimable) sampled every 20 ms in a background thread."""

    def __init__(self) -> None:
        import threading

        self.anon = self.file = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            st = {ln.split(":")[0]: ln.split()[1] for ln in Path("/proc/self/status").read_text().splitlines()
                  if ln.startswith(("RssAnon", "RssFile"))}
            self.anon = max(self.anon, int(st.get("RssAnon", 0)) / 1024)
            self.file = max(self.file, int(st.get("RssFile", 0)) / 1024)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        return {"peak_anon_mib": round(self.anon, 1), "peak_file_mib": round(self.file, 1)}


def measure(mode: str, work: Path, dtype: str) -> dict:
    t0 = time.perf_counter()
    sampler = _RssSampler()
    import torch  # noqa: F401

    import eagle_migrate.convert as cv

    out = work / f"out-{mode}"
    res = None
    if mode == "passthrough":
        res = cv.convert(work / "drafter31", str(work / "target"), out, force=True, dtype=dtype, calibrate=False, command="bench")
    elif mode.startswith("convert"):
        res = cv.convert(work / "drafter", str(work / "target"), out, hidden_states_dir=work / "hidden", num_sequences=16,
                         force=True, dtype=dtype, calibrate=False, evaluate=(mode == "convert-full"), command="bench")
    peak = _vm_hwm_mib()
    d = {"mode": mode, "peak_rss_mib": round(peak, 1), **sampler.stop(), "seconds": round(time.perf_counter() - t0, 1)}
    if res is not None:
        d["norm_init"] = res.norm_init.method if res.norm_init else None
        d["agreement_step0"] = res.agreement.step0
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/em-bench")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = Path(a.workdir)
    if a.mode:
        print(json.dumps(measure(a.mode, work, a.dtype)))
        return
    if not (work / "hidden").exists():  # built in a child so that this process stays small
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                        f"import convert_memory as m; from pathlib import Path; m.build(Path({str(work)!r}))"], check=True)
    from safetensors import safe_open

    with safe_open(str(work / "drafter" / "model.safetensors"), "pt") as f:
        sizes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    largest = max(sizes, key=lambda k: __import__("math").prod(sizes[k]))
    info = {"drafter_file_mib": round(os.path.getsize(work / "drafter" / "model.safetensors") / 2**20, 1),
            "largest_tensor": largest, "largest_tensor_mib_bf16": round(__import__("math").prod(sizes[largest]) * 2 / 2**20, 1),
            "target_embedding_mib_bf16": round(V * H * 2 / 2**20, 1)}
    print(json.dumps(info))
    for mode in ("baseline", "passthrough", "convert-structural", "convert-full"):
        r = subprocess.run([sys.executable, __file__, "--workdir", str(work), "--dtype", a.dtype, "--mode", mode],
                           capture_output=True, text=True)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        print(line[-1] if line else json.dumps({"mode": mode, "error": r.stderr[-500:]}), flush=True)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
