"""bench/report.py's joining of benchmark runs: a further filtered run of the same build adds its
cases and headline keys to results/cuda.{json,txt}, never its ceilings."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case(name, value):
    return {"name": name, "value": value, "unit": "us", "fraction_of_ceiling": 0.5,
            "median_us": value, "cv": 0.01}


def write_run(directory, stem, ceiling, cases, headline):
    run = {"device": "GPU", "hbm_read_tbps": ceiling, "bf16_gemm_tflops": 700.0,
           "fp8_gemm_tflops": 1400.0, "fp8_gemm_sustained_tflops": 1200.0, "headline": headline,
           "cases": [case("ceiling: HBM read stream (4 GiB, 16-byte loads)", ceiling)] + cases}
    (directory / f"{stem}.json").write_text(json.dumps(run))
    (directory / f"{stem}.txt").write_text(
        "\n".join(f"{c['name']}  {c['value']}" for c in run["cases"]) + "\n")


def test_merge_run_adds_cases_and_headline_but_not_ceilings(tmp_path):
    report = load_report()
    results = tmp_path / "results"
    results.mkdir()
    write_run(results, "cuda", 3.0, [case("indexer prefill a", 1.0), case("shared case", 2.0)],
              {"key_a": 1.0})
    write_run(tmp_path, "run_b", 3.1, [case("attention b", 5.0), case("shared case", 7.0)],
              {"key_b": 2.0})
    report.merge_run(str(results), str(tmp_path / "run_b.json"))

    merged = json.loads((results / "cuda.json").read_text())
    names = [c["name"] for c in merged["cases"]]
    assert names.count("ceiling: HBM read stream (4 GiB, 16-byte loads)") == 1
    assert merged["hbm_read_tbps"] == 3.0  # the first run's ceilings stay at the top
    assert {"indexer prefill a", "attention b", "shared case"} <= set(names)
    assert next(c for c in merged["cases"] if c["name"] == "shared case")["value"] == 7.0
    assert names.count("shared case") == 1
    assert merged["headline"] == {"key_a": 1.0, "key_b": 2.0}
    assert merged["merged_runs"] == [{"file": "run_b.json", "device": "GPU", "hbm_read_tbps": 3.1,
                                      "bf16_gemm_tflops": 700.0, "fp8_gemm_tflops": 1400.0,
                                      "fp8_gemm_sustained_tflops": 1200.0}]
    text = (results / "cuda.txt").read_text().splitlines()
    assert text.count("ceiling: HBM read stream (4 GiB, 16-byte loads)  3.0") == 1
    assert "attention b  5.0" in text
    assert "shared case  7.0" in text and "shared case  2.0" not in text
    assert not any(line.startswith("ceiling:") and line.endswith("3.1") for line in text)


def test_attention_headline_reads_its_cases_and_the_same_device_sdpa():
    report = load_report()
    cuda = {"device": "GPU", "headline": {}, "cases": [
        case("sparse attention prefill, 1 x 32K, coherent (74.6 pages/64 rows, 26.3/8, 21.1/4)",
             153.8),
        case("prefill 0K + 32K, random: end to end", 28533.9),
        case("prefill 0K + 8K, coherent: end to end", 3000.0),
        case("production prefill set (128 cases), coherent: weighted TFLOP/s, FLOPs computed",
             5107.9),
    ]}
    keys = report.attention_headline(cuda, None)
    assert keys == pytest.approx({"prefill_attn_32K_coherent_tflops": 153.8,
                                  "prefill_e2e_32K_random_ms": 28.5339,
                                  "production_weighted_ms_coherent": 5.1079})
    sdpa = {"device": "GPU", "cases": [
        {"name": "prefill 0K + 8K", "backend": "cudnn", "median_us": 1500.0},
        {"name": "prefill 0K + 8K", "backend": "flash", "median_us": 3300.0}]}
    speedup = report.attention_headline(cuda, sdpa)["prefill_e2e_8K_dense_speedup"]
    assert speedup == pytest.approx(0.5)  # the fastest backend (1.5 ms) over ours (3.0 ms)
