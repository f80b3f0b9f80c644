#!/usr/bin/env bash
# One cold `eagle-migrate convert SRC --target B -o OUT --json` with the defaults (issue 50's 15 minutes): a fresh
# EAGLE_MIGRATE_CACHE holding only the SmolLM2 files and the data wheels (links into ~/.cache/eagle-migrate), so no
# continuations or features are reused; stderr's progress lines get the seconds since the start; the JSON result goes
# to OUT.json, "rc=... wall=..." to LOG.done. EM: the command (default .venv/bin/eagle-migrate; another checkout's
# code: EM="$PWD/.venv/bin/python -m eagle_migrate" run from that checkout with PYTHONPATH set to it).
#   bash benchmarks/retarget/cold_convert.sh SRC OUT LOG [B] [extra convert args...]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$1; OUT=$2; LOG=$3; B=${4:-$ROOT/runs/retarget/targets/format-lr0.0002-s40}; shift $(( $# < 4 ? $# : 4 ))
C=$(mktemp -d /tmp/cold-cache.XXXX)
for x in SmolLM2-135M-Instruct data wheels; do ln -s "$HOME/.cache/eagle-migrate/$x" "$C/$x"; done
export EAGLE_MIGRATE_CACHE=$C OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
t0=$(date +%s.%N)
${EM:-$ROOT/.venv/bin/eagle-migrate} convert "$SRC" --target "$B" -o "$OUT" --json "$@" \
  2> >(while IFS= read -r l; do printf '%7.1f %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$l"; done > "$LOG") > "$OUT.json"
rc=$?
echo "rc=$rc wall=$(echo "$(date +%s.%N) - $t0" | bc)" >> "$LOG.done"
rm -rf "$C"
