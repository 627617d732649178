"""How many distinct pages the union of n neighbouring tokens' selections holds, for the
benchmark's random selection model (each token: its own block and 15 distinct earlier blocks,
uniformly; every visible block while it sees at most 16). For n = 8 it reproduces the benchmark's
sharing statistic ("x/8" in the prefill attention cases' names); larger n say what a page load
shared by more tokens would save (docs/performance.md, prefill attention).

    python3 bench/sharing_model.py [--context 32768 131072] [--tokens 8 16 64] [--tiles 3000]
"""

import argparse

import numpy as np


def distinct_pages(context, tokens, tiles, rng):
    counts = []
    for _ in range(tiles):
        first = int(rng.integers(0, context // tokens)) * tokens
        union = set()
        for pos in range(first, first + tokens):
            own = pos // 128
            if own < 16:
                union.update(range(own + 1))
            else:
                union.update(rng.choice(own, 15, replace=False).tolist())
                union.add(own)
        counts.append(len(union))
    return float(np.mean(counts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--tiles", type=int, default=3000)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    for context in args.context:
        for tokens in args.tokens:
            pages = distinct_pages(context, tokens, args.tiles, rng)
            print(f"context {context}, {tokens} tokens: {pages:.1f} distinct pages "
                  f"({pages / (16 * tokens):.2f} a selection)")


if __name__ == "__main__":
    main()
