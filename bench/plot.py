"""PNG plots of the CUDA benchmark (and the SDPA baseline when present), for docs/performance.md.

    python3 bench/plot.py bench/results            # reads cuda.json [+ sdpa.json], writes *.png

Needs matplotlib (not a build or test dependency: plots are made wherever it is installed, from
the JSON the benchmark wrote).
"""

import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def decode_grid_plot(cuda, out_dir, plt):
    # name: "decode grid <dtype> <B>x<ctx>K dql<q>: step"
    pat = re.compile(r"decode grid (\w+) (\d+)x(\d+)K dql(\d+): step")
    series = {}
    for c in cuda["cases"]:
        m = pat.fullmatch(c["name"])
        if m:
            dtype, b, ctx, dql = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            series.setdefault((dtype, dql), {}).setdefault(b, []).append(
                (ctx, 100 * c["fraction_of_ceiling"]))
    if not series:
        return None
    keys = sorted(series)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.6), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        for b, points in sorted(series[key].items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"B={b}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{key[0]} cache, dql {key[1]}")
        ax.set_xlabel("context (K tokens)")
        ax.axhline(85, color="gray", linestyle=":", linewidth=1)
    axes[0][0].set_ylabel("decode step, % of HBM read ceiling")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "decode_grid.png")
    fig.savefig(path, dpi=120)
    return path


def prefill_plot(cuda, sdpa, out_dir, plt):
    # Times, not TFLOP/s: sparse and dense count different FLOPs; time is what users compare.
    pat = re.compile(r"(prefill \d+K \+ \d+K), (coherent|random): (indexer|attention|end to end).*")
    bars = {}
    for c in cuda["cases"]:
        m = pat.fullmatch(c["name"])
        if m:
            bars.setdefault(m.group(1), {})[f"{m.group(3)} ({m.group(2)})"] = c["median_us"] / 1e3
    if sdpa:  # the dense baseline: same shapes, every key
        for c in sdpa["cases"]:
            if c["name"] in bars and "median_us" in c:
                bars[c["name"]][f"dense SDPA {c['backend']}"] = c["median_us"] / 1e3
    if not bars:
        return None
    shapes = list(bars)
    labels = sorted({k for v in bars.values() for k in v})
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(shapes)), 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        ax.bar([s + i * width for s in range(len(shapes))],
               [bars[sh].get(label, 0) for sh in shapes], width, label=label)
    ax.set_xticks([s + 0.4 - width / 2 for s in range(len(shapes))], shapes)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (ms, log scale)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = os.path.join(out_dir, "prefill.png")
    fig.savefig(path, dpi=120)
    return path


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed; no plots (the JSON has every number)")
        return
    cuda = load(os.path.join(out_dir, "cuda.json"))
    sdpa_path = os.path.join(out_dir, "sdpa.json")
    sdpa = load(sdpa_path) if os.path.exists(sdpa_path) else None
    for path in (decode_grid_plot(cuda, out_dir, plt), prefill_plot(cuda, sdpa, out_dir, plt)):
        if path:
            print("wrote", path)


if __name__ == "__main__":
    main()
