"""Dense causal GQA attention with torch's scaled_dot_product_attention, the baseline of
flashmsa_cuda_bench's prefill figures: the same shapes (single requests, chunked prefill, the
production case set), cuDNN and flash backends, CUDA events, warm-up, median and coefficient of
variation. Useful FLOPs: 4 * 128 per (q head, causal key), 64 q heads, 4 kv heads, d 128.

    python3 bench/sdpa_baseline.py --json bench/results/sdpa.json [--cases JSONL]
    python3 bench/sdpa_baseline.py --smoke        # tiny shapes, any device (checks the script)
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HQ, HKV, D = 64, 4, 128
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def dense_flops(prefix, query):
    # sum over new tokens t of the keys they see (prefix + t + 1), times 4 * D per q head
    return 4.0 * D * HQ * sum(p * q + q * (q + 1) / 2 for p, q in zip(prefix, query))


def attend(q, k, v, prefix):
    mask = None if prefix == 0 else causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=prefix == 0,
                                          enable_gqa=True)


def time_call(fn, device, reps, warmup=2):
    if device.type != "cuda":
        import time
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), statistics.pstdev(ts) / statistics.mean(ts)
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts), statistics.pstdev(ts) / statistics.mean(ts)


def run_case(name, prefix, query, device, backends, reps):
    g = torch.Generator(device=device).manual_seed(0)
    inputs = []
    for p, n in zip(prefix, query):
        q = torch.randn((1, HQ, n, D), device=device, generator=g, dtype=torch.bfloat16)
        k = torch.randn((1, HKV, p + n, D), device=device, generator=g, dtype=torch.bfloat16)
        v = torch.randn((1, HKV, p + n, D), device=device, generator=g, dtype=torch.bfloat16)
        inputs.append((q, k, v, p))
    flops = dense_flops(prefix, query)
    rows = []
    for backend in backends:
        def call():
            with sdpa_kernel(BACKENDS[backend]) if backend in BACKENDS else _null():
                for q, k, v, p in inputs:
                    attend(q, k, v, p)
        try:
            median, cv = time_call(call, device, reps)
            rows.append({"name": name, "backend": backend, "median_us": median * 1e6, "cv": cv,
                         "tflops": flops / median / 1e12})
        except RuntimeError as e:  # a backend that cannot run this shape says why
            rows.append({"name": name, "backend": backend, "error": str(e).splitlines()[0]})
        r = rows[-1]
        print(f"{name:48s} {backend:6s} " +
              (f"{r['tflops']:8.1f} TFLOP/s {r['median_us']:12.1f} us  cv {r['cv']:.3f}"
               if "error" not in r else "unavailable: " + r["error"]), flush=True)
    return rows


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--cases", default="bench/data/msa_prefill_benchmark_v1.jsonl")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = list(BACKENDS) if device.type == "cuda" else ["math"]
    if args.smoke:
        shapes = [("prefill 0K + 0.25K", [0], [256]), ("prefill 0.5K + 0.125K", [512], [128])]
        cases = []
    else:
        shapes = [(f"prefill {p // 1024}K + {n // 1024}K", [p], [n])
                  for p, n in [(0, 8192), (0, 32768), (0, 131072), (131072, 8192),
                               (1048576, 8192)]]
        with open(args.cases) as f:
            cases = [json.loads(line) for line in f if line.strip()]
    rows = []

    def save():  # after every case: a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda"
                           else "cpu", "torch": torch.__version__, "cases": rows}, f, indent=1)

    for name, prefix, query in shapes:
        rows += run_case(name, prefix, query, device, backends, reps=5)
        save()
    for c in cases:
        rows += run_case("case " + c["case_id"], c["prefix_lens"], c["query_lens"], device,
                         backends, reps=3)
        save()


if __name__ == "__main__":
    main()
