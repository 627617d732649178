"""How the H200's power limit moves an fp8 GEMM's rate (the projection's yardstick): cuBLASLt through
torch._scaled_mm (per-tensor scales) at 8192^3 and at the projection's shapes, timed in bursts
(3 warm-up, 10 runs each synchronised: the benchmark's ceiling) and sustained (20 runs back to
back per timing, 13 timings: how the benchmark times the projection), with the SM clock and power
after each; and torch's row-wise scaled fp8 GEMM at the projection's shapes for comparison.

    python3 bench/fp8_clock_study.py     # on the GPU machine; results: bench/results/fp8_clock_study.txt
"""

import statistics
import subprocess

import torch


def fp8_operands(m, n, k):
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    return a, b


def per_tensor_gemm(m, n, k):
    a, b = fp8_operands(m, n, k)
    one = torch.tensor(1.0, device="cuda")
    return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)


def rowwise_gemm(m, n, k):
    a, b = fp8_operands(m, n, k)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)


def burst(run, flops):
    for _ in range(3):
        run()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return flops / statistics.median(times) / 1e12


def sustained(run, flops, back_to_back=20):
    times = []
    for rep in range(13):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(back_to_back):
            run()
        end.record()
        end.synchronize()
        if rep >= 3:
            times.append(start.elapsed_time(end) * 1e-3 / back_to_back)
    return flops / statistics.median(times) / 1e12, statistics.pstdev(times) / statistics.mean(times)


def clock_and_power():
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True).stdout.strip()


def main():
    for m, n, k in [(8192, 8192, 8192), (4096, 9856, 6144), (16384, 9856, 6144)]:
        run, flops = per_tensor_gemm(m, n, k), 2.0 * m * n * k
        rate_burst = burst(run, flops)
        rate, cv = sustained(run, flops)
        print(f"{m}x{n}x{k}: burst {rate_burst:.0f} TFLOP/s; sustained {rate:.0f} (cv {cv:.3f}); "
              f"after: {clock_and_power()}")
        print(f"{m}x{n}x{k}: burst again {burst(run, flops):.0f}", flush=True)
    for m, n, k in [(4096, 9856, 6144), (16384, 9856, 6144)]:
        run, flops = rowwise_gemm(m, n, k), 2.0 * m * n * k
        print(f"rowwise {m}x{n}x{k}: burst {burst(run, flops):.0f}; "
              f"sustained {sustained(run, flops)[0]:.0f}", flush=True)


if __name__ == "__main__":
    main()
