#!/usr/bin/env python3
"""Where one kernel's warps wait, from the SASS source page of a profile (scripts/profile.sh's
NAME.sass.csv: Nsight Compute's per-instruction warp-stall samples).

  scripts/sass_stalls.py NAME.sass.csv                   # stall reasons, the top instructions
  scripts/sass_stalls.py NAME.sass.csv --top 30
  scripts/sass_stalls.py NAME.sass.csv --landmarks       # samples between barriers, waits, MMAs
  scripts/sass_stalls.py NAME.sass.csv --regions 0:prologue 5c40:loop 8780:epilogue

Offsets are from the kernel's first instruction, as cuobjdump -sass prints them (/*5c40*/).
--landmarks lists the instructions that delimit a warp-specialized kernel's phases (wgmma
issues and waits, mbarrier waits and arrivals, CTA and named barriers, exits, setmaxnreg) with
the share of samples since the previous one (those of 0.1% or more): the way to choose
--regions. Each region is the
share of all samples from its offset to the next region's. Samples are per warp: a producer
warp waiting on its barrier is counted like a consumer waiting on its MMA, so read a region's
share against the warps that run it.
"""

import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
LANDMARK = re.compile(r"HGMMA|DEPBAR|SYNCS|USETMAXREG|BAR\.|EXIT|UCGABAR")


def read(path):
    """(offset, instruction, samples, {reason: samples}) for each instruction."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header is None:
        sys.exit(f"{path}: no \"Address\" header row (not ncu's --page source --csv export?)")
    names = rows[header]
    col = {n: i for i, n in enumerate(names)}
    reasons = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    data = [r for r in rows[header + 1:] if len(r) == len(names)]
    if not data:
        sys.exit(f"{path}: no instructions (not a --page source --csv export?)")
    base = int(data[0][0], 16)
    out = []
    for r in data:
        by_reason = {n[len("stall_"):]: int(r[col[n]] or 0) for n in reasons}
        out.append((int(r[0], 16) - base, r[col["Source"]].strip(), int(r[col[SAMPLES]] or 0),
                    by_reason))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15, help="instructions listed (default 15)")
    parser.add_argument("--landmarks", action="store_true")
    parser.add_argument("--regions", nargs="+", metavar="OFFSET:NAME")
    args = parser.parse_args()
    code = read(args.csv)
    total = sum(s for _, _, s, _ in code) or 1
    pct = lambda n: f"{100 * n / total:5.1f}%"

    reasons = collections.Counter()
    for _, _, _, by_reason in code:
        reasons.update(by_reason)
    print(f"{total} samples; by reason: " +
          ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in reasons.most_common(8) if v))
    print("(a reason the page does not name, e.g. a wgmma waiting to issue, is counted in the "
          "instruction's samples only)")

    if args.regions:
        bounds = sorted((int(o, 16), n) for o, n in (x.split(":", 1) for x in args.regions))
        share = collections.Counter()
        for offset, _, s, _ in code:
            owner = [n for o, n in bounds if o <= offset]
            share[owner[-1] if owner else "(before the first region)"] += s
        for name in [n for _, n in bounds] + ["(before the first region)"]:
            if share[name]:
                print(f"{pct(share[name])}  {name}")
    elif args.landmarks:
        since = 0
        for offset, text, s, _ in code:
            since += s
            if LANDMARK.search(text) and max(since, s) >= total // 1000:  # 0.1% or more
                print(f"{offset:6x} {pct(since)} (own {pct(s)})  {text[:80]}")
                since = 0
        print(f"{'':6s} {pct(since)}  (after the last landmark)")
    else:
        for offset, text, s, by_reason in sorted(code, key=lambda c: -c[2])[:args.top]:
            main_reasons = sorted(((v, k) for k, v in by_reason.items() if v), reverse=True)[:2]
            named = ", ".join(f"{k} {100 * v // max(s, 1)}%" for v, k in main_reasons)
            print(f"{pct(s)} {offset:6x}  {text[:64]:64s} {named}")


if __name__ == "__main__":
    main()
