#!/usr/bin/env bash
# The structural conversion of benchmarks/convert_memory.py inside a memory cgroup capped below its peak RSS:
# the RSS peak counts clean pages of the memory-mapped inputs, which the kernel reclaims under the cap; a run that
# needed them as allocations would be OOM-killed. Needs root and a writable cgroup-v1 memory controller
# (/sys/fs/cgroup/memory) or cgroup v2 (/sys/fs/cgroup with memory.max). Usage: convert_memory_capped.sh [MiB] [workdir]
set -euo pipefail
cap_mib=${1:-800}
work=${2:-/tmp/em-bench}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
if [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/eagle-migrate-bench-$$
  mkdir "$cg"
  echo $((cap_mib * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
  echo $((cap_mib * 1024 * 1024)) > "$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
  peak=memory.max_usage_in_bytes
else
  cg=/sys/fs/cgroup/eagle-migrate-bench-$$
  mkdir "$cg"
  echo $((cap_mib * 1024 * 1024)) > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  peak=memory.peak
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
[ -d "$work/hidden" ] || "$py" -c "import sys; sys.path.insert(0, '$here'); import convert_memory as m; from pathlib import Path; m.build(Path('$work'))"  # inputs built outside the cap
# evict the inputs from the page cache, so that the run reads (and is charged for) every page it touches
"$py" -c "
import os, sys
from pathlib import Path
for f in Path(sys.argv[1]).rglob('*'):
    if f.is_file():
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)" "$work"
set +e
bash -c "echo \$\$ > '$cg/cgroup.procs'; exec '$py' '$here/convert_memory.py' --workdir '$work' --mode convert-structural"
rc=$?
set -e
echo "{\"cap_mib\": $cap_mib, \"exit\": $rc, \"cgroup_peak_mib\": $(( $(cat "$cg/$peak") / 1048576 ))}"
exit $rc
