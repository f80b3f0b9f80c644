#!/usr/bin/env bash
# Arm 5 of issue 50: the route the field uses today to refit a drafter to a changed target. speculators' own trainer
# (speculators 0.9.0, `speculators train --from-pretrained`) started from the source's weights, with its config's
# norm flags edited to EAGLE-3.1 (fc_norm + norm_output, as speculators 0.9 names them), trained on B's hidden states
# of the same ShareGPT data arm 0 uses, for a fixed wall time (the wall time of arm 3's `convert --target B`), then
# stopped (SIGTERM: speculators saves CK/interrupted).
#
#   SRC=runs/retarget/src-best WALL=900 bash benchmarks/retarget/arm5.sh [OUT]
#
# Environment: SRC (the source trained for A: a speculators checkpoint folder), W (arm 0's work folder, with dsA/ and
# its hidden states of B and token_freq.pt; made by runs of benchmarks/train_speculators_smollm2.sh with TARGET=B and
# STOP=train), TARGET (B), WALL (seconds of training), LR (default 1e-4: a refit, not a fresh run), NORMS (1: edit the
# config to EAGLE-3.1, the default; 0: keep the source's flags), SPEC_VENV (the venv with speculators 0.9.0).
# MAX_STEPS (optional: stop after that many optimizer steps instead, with the LR schedule of the 3-epoch run, so
# that a run on a loaded box gets what WALL seconds give on a quiet one; its drafter is then CK/0).
# OUT (default runs/retarget/arm5/<source>-<wall>s) holds src/ (the edited copy) and CK/ (speculators' checkpoints);
# the drafter to serve is the newest folder under CK/ (benchmarks/retarget/arms.py --drafter arm5=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SRC=${SRC:?SRC: the source checkpoint folder}
W=${W:-runs/retarget/arm0-format-s40}
TARGET=${TARGET:-$ROOT/runs/retarget/targets/format-lr0.0002-s40}
WALL=${WALL:?WALL: seconds of training (arm 3 convert wall time)}
LR=${LR:-1e-4}
NORMS=${NORMS:-1}
MAX_STEPS=${MAX_STEPS:-}
SCHED_STEPS=${SCHED_STEPS:-3237}  # 3 epochs of 1,079 steps: arm 0's data (the schedule a timed run follows)
SPEC_VENV=${SPEC_VENV:-/work/peer-venvs/speculators}
OUT=${1:-runs/retarget/arm5/$(basename "$SRC")-${WALL}s}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(cd "$W" && pwd)
[ -d "$W/dsA/hidden_states" ] || { echo "no $W/dsA/hidden_states: run arm 0's data stages first" >&2; exit 2; }
rm -rf "$OUT/src" && cp -r "$SRC" "$OUT/src"
"$SPEC_VENV/bin/python" - "$OUT/src/config.json" "$NORMS" <<'EOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["dtype"] = "float32"  # trained in fp32 on fp32 hidden states, as the source was (its checkpoint is stored in bf16)
if sys.argv[2] == "1":
    c["fc_norm"], c["norm_output"] = True, True  # EAGLE-3.1 in speculators 0.9's names; the new norms start at ones
json.dump(c, open(p, "w"), indent=2)
EOF
echo "arm5: $SRC -> $OUT, ${WALL}s${MAX_STEPS:+ (or $MAX_STEPS steps)}, lr $LR, norms $NORMS, start $(date -u)"
set +e
(cd "$W" && OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} timeout -s TERM "$WALL" "$SPEC_VENV/bin/python" \
  "$ROOT/benchmarks/speculators_train_cpu.py" --speculator-type eagle3 --from-pretrained "$OUT/src" \
  --verifier-name-or-path "$TARGET" --data-path dsA --hidden-states-path dsA/hidden_states --on-missing raise \
  --token-freq-path token_freq.pt --total-seq-len 256 --hidden-states-dtype float32 --num-workers 0 --ttt-steps 3 \
  --loss-implementation eager --draft-attn-impl sdpa --lr "$LR" --epochs 3 --save-path "$OUT/CK" --no-resume-from-checkpoint \
  ${MAX_STEPS:+--max-steps "$MAX_STEPS" --scheduler-total-steps "$SCHED_STEPS"})
rc=$?
set -e
echo "arm5: trainer exit $rc (124: stopped at ${WALL}s, as planned) $(date -u)"
# the drafter: CK/0 after MAX_STEPS (speculators then runs one step in each later epoch and saves it), else the newest
if [ -n "$MAX_STEPS" ]; then echo "$OUT/CK/0/"; else ls -td "$OUT/CK"/[0-9]*/ "$OUT/CK"/interrupted/ 2>/dev/null | head -1; fi
