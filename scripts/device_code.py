#!/usr/bin/env python3
"""Snapshots and compares the device code (SASS) of every kernel a build compiled.

A refactoring of the CUDA sources that must not change what runs (the generated code of
today's kernels stays equivalent) is checked by taking a snapshot before and after:

  scripts/device_code.py snapshot build /tmp/before     # one file per kernel
  ... change the sources, rebuild ...
  scripts/device_code.py snapshot build /tmp/after
  scripts/device_code.py compare /tmp/before /tmp/after [--rename OLD=NEW ...]
      [--ignore-param-offsets]

The SASS of each kernel (from `cuobjdump -sass` over the build's CUDA objects, instruction
addresses and encodings dropped) is the unit; identical SASS means identical behaviour on the
GPU. --rename maps a substring of the old (demangled) names to the new one, for kernels whose
name changed with the move (a namespace, a template argument's type). Needs cuobjdump (CUDA
toolkit) and c++filt (binutils); set CUOBJDUMP to use another cuobjdump. Where the toolkit came
without them (nvcc alone), the PyPI wheels have both: `pip download nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm --no-deps -d /tmp/w`, unzip each, and put their `nvidia/cu13/bin` on PATH
(cuobjdump runs nvdisasm). `cuobjdump -res-usage OBJ` gives registers and spills the same way.
"""

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    for candidate in (found, "/usr/local/cuda/bin/cuobjdump"):
        if candidate and os.path.exists(candidate):
            return candidate
    sys.exit("device_code.py: cuobjdump not found (set CUOBJDUMP)")


def kernels(obj: pathlib.Path) -> dict:
    """Demangled kernel name -> normalised SASS lines, for one object file."""
    out = subprocess.run([cuobjdump(), "-sass", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    result, name, body = {}, None, []
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                result[name] = body
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$", line)
        if m:  # an instruction; its encoding line (/* 0x... */ alone) is dropped
            body.append(m.group(1))
    if name:
        result[name] = body
    names = list(result)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                               text=True, check=True).stdout.splitlines()
    return {d: result[n] for n, d in zip(names, demangled)}


def snapshot(build: str, dest: str) -> None:
    root = pathlib.Path(build)
    # The library's own objects (delete stale ones of renamed sources first).
    objects = sorted((root / "CMakeFiles" / "flashmsa.dir").rglob("*.cu.o"))
    if not objects:
        sys.exit(f"device_code.py: no CUDA objects of the flashmsa library under {build}")
    out = pathlib.Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for obj in objects:
        for name, body in kernels(obj).items():
            key = hashlib.sha1(name.encode()).hexdigest()[:16]
            (out / f"{key}.sass").write_text(name + "\n" + "\n".join(body) + "\n")
            count += 1
    print(f"{count} kernels from {len(objects)} objects -> {dest}")


def load(directory: str) -> dict:
    result = {}
    for f in pathlib.Path(directory).glob("*.sass"):
        name, _, body = f.read_text().partition("\n")
        result[name] = body
    return result


def compare(before: str, after: str, renames: list, ignore_param_offsets: bool) -> int:
    old, new = load(before), load(after)
    if ignore_param_offsets:  # kernel parameters moved within the constant bank, nothing else
        mask = lambda body: re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][param]", body)
        old = {n: mask(b) for n, b in old.items()}
        new = {n: mask(b) for n, b in new.items()}
    mapped = {}
    for name, body in old.items():
        for rename in renames:
            a, _, b = rename.partition("=")
            name = name.replace(a, b)
        mapped[name] = body
    same = [n for n in mapped if n in new and mapped[n] == new[n]]
    changed = [n for n in mapped if n in new and mapped[n] != new[n]]
    gone = [n for n in mapped if n not in new]
    added = [n for n in new if n not in mapped]
    print(f"{len(same)} kernels identical, {len(changed)} changed, {len(gone)} gone, "
          f"{len(added)} new")
    for label, names in (("changed", changed), ("gone", gone), ("new", added)):
        for n in sorted(names):
            print(f"  {label}: {n}")
    return 0 if not (changed or gone or added) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot", help="write one file per kernel of a build")
    s.add_argument("build")
    s.add_argument("dest")
    c = sub.add_parser("compare", help="compare two snapshots (exit 1 on any difference)")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    c.add_argument("--ignore-param-offsets", action="store_true",
                   help="treat kernels whose SASS differs only in parameter offsets as identical")
    args = parser.parse_args()
    if args.command == "snapshot":
        snapshot(args.build, args.dest)
        return 0
    return compare(args.before, args.after, args.rename, args.ignore_param_offsets)


if __name__ == "__main__":
    sys.exit(main())
