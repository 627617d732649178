"""The Python package on the CPU with numpy arrays: configuration, caches, metadata, and the
operations against a plain numpy fp64 oracle.

Tolerances follow the FlashAttention rule as in the C++ tests: the attention output's max error
against fp64 must be at most 2x that of rounding the fp64 result to bf16 once, plus 1e-6.
"""

import subprocess
import sys

import numpy as np
import pytest

import flashmsa

HQ, HKV, D, HIDX, DI, BLOCK = 64, 4, 128, 4, 128, 128


to_bf16, from_bf16 = flashmsa.to_bf16, flashmsa.from_bf16


def test_config_defaults_and_validation():
    c = flashmsa.Config()
    assert c.validate() == []
    assert (c.num_attention_heads, c.num_key_value_heads, c.sparse_topk_blocks) == (64, 4, 16)
    assert c.kv_cache_dtype == "bf16"
    c.sparse_num_index_heads = 0
    c.sparse_score_type = "mean"
    problems = c.validate()
    assert "sparse_num_index_heads must be > 0, got 0" in problems
    assert any(p.startswith("sparse_score_type must be") for p in problems)
    with pytest.raises(ValueError, match="sparse_num_index_heads must be > 0, got 0"):
        c.check()
    with pytest.raises(ValueError, match="unknown dtype 'fp4'"):
        c.kv_cache_dtype = "fp4"
    assert flashmsa.Config().unsupported_reason("cpu") is None


def test_cache_manager_and_metadata():
    cm = flashmsa.CacheManager(flashmsa.Config(), num_pages=4, shuffle_seed=3)
    r = cm.add_request()
    assert cm.append(r, 200) == 200
    assert len(cm.pages(r)) == 2
    table = cm.block_table([r, -1], 3)
    assert table.dtype == np.int32 and table.shape == (2, 3)
    assert list(table[0, :2]) == cm.pages(r) and table[0, 2] == -1 and (table[1] == -1).all()
    slots = cm.slot_mapping(r, 126, 3)
    assert list(slots) == [cm.pages(r)[0] * 128 + 126, cm.pages(r)[0] * 128 + 127,
                           cm.pages(r)[1] * 128]
    with pytest.raises(RuntimeError, match="out of cache pages"):
        cm.append(r, 1000)
    assert cm.length(r) == 200
    cm.check_invariants()
    md = flashmsa.build_batch_metadata([(10, 2)], 2, [(0, 3)], decode_capacity=2)
    assert list(md["cu_seqlens_q"]) == [0, 2, 4, 7]
    assert list(md["token_position"]) == [10, 11, -2, -1, 0, 1, 2]


def make_batch(lengths, queries, seed):
    """A manager with random K/V/index-K for every request, and the batch arrays."""
    rng = np.random.default_rng(seed)
    config = flashmsa.Config()
    pages = sum((n + BLOCK - 1) // BLOCK for n in lengths) + 2
    cm = flashmsa.CacheManager(config, num_pages=pages, shuffle_seed=seed)
    ids, data = [], []
    for n in lengths:
        r = cm.add_request()
        cm.append(r, n)
        k = rng.standard_normal((n, HKV, D), dtype=np.float32)
        v = rng.standard_normal((n, HKV, D), dtype=np.float32)
        ik = rng.standard_normal((n, DI), dtype=np.float32)
        slots = cm.slot_mapping(r, 0, n)
        flashmsa.insert_kv(cm.kv_cache, to_bf16(k), to_bf16(v), slots)
        flashmsa.insert_index_k(cm.index_cache, to_bf16(ik), slots)
        ids.append(r)
        data.append((from_bf16(to_bf16(k)), from_bf16(to_bf16(v)), from_bf16(to_bf16(ik))))
    max_blocks = max((n + BLOCK - 1) // BLOCK for n in lengths)
    table = cm.block_table(ids, max_blocks)
    cu = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    lens = np.asarray(lengths, dtype=np.int32)
    t = int(cu[-1])
    q = to_bf16(rng.standard_normal((t, HQ, D), dtype=np.float32))
    iq = to_bf16(rng.standard_normal((t, HIDX, DI), dtype=np.float32))
    return config, cm, data, cu, lens, table, q, iq


def oracle_topk(iq, ik, position, topk=16):
    """fp64 block scores (max dot over visible keys), local block forced, top-k ascending."""
    nvb = position // BLOCK + 1
    scores = iq.astype(np.float64) @ ik[: position + 1].astype(np.float64).T
    blocks = np.full(nvb, -np.inf)
    for b in range(nvb):
        blocks[b] = scores[b * BLOCK: min(position + 1, (b + 1) * BLOCK)].max()
    blocks[nvb - 1] = 1e29
    order = sorted(range(nvb), key=lambda b: (-blocks[b], b))[: min(topk, nvb)]
    return sorted(order) + [-1] * (topk - min(topk, nvb)), blocks


def oracle_attention(q, k, v, position, blocks):
    """fp64 attention of one row (q [HQ, D]); blocks[kv] lists kv head kv's selected blocks."""
    out = np.zeros((HQ, D))
    for h in range(HQ):
        kv = h // (HQ // HKV)
        keys = [j for b in blocks[kv] if b >= 0
                for j in range(b * BLOCK, min(position + 1, (b + 1) * BLOCK))]
        logits = k[keys, kv].astype(np.float64) @ q[h].astype(np.float64) / np.sqrt(D)
        p = np.exp(logits - logits.max())
        out[h] = (p / p.sum()) @ v[keys, kv].astype(np.float64)
    return out


def test_prefill_indexer_and_sparse_attention_match_numpy_oracle():
    lengths, queries = [300, 2100], [5, 4]
    config, cm, data, cu, lens, table, q, iq = make_batch(lengths, queries, seed=1)
    topk = flashmsa.index_prefill(config, iq, cm.index_cache, cu, lens, table, checked=True)
    assert topk.shape == (HKV, 9, 16) and topk.dtype == np.int32
    out = np.full((9, HQ, D), 0xFFFF, dtype=np.uint16)  # NaN poison
    lse = np.full((9, HQ), 7.0, dtype=np.float32)
    flashmsa.sparse_attention_prefill(config, q, cm.kv_cache, cu, lens, table, topk, out, lse=lse)
    err = honest = 0.0
    for r, (start, n) in enumerate(zip(cu[:-1], queries)):
        k, v, ik = data[r]
        for i in range(n):
            t, position = start + i, lengths[r] - n + i
            for h in range(HKV):
                want, scores = oracle_topk(from_bf16(iq[t, h]), ik, position)
                got = list(topk[h, t])
                # Only near-ties may differ: within the fp32 dot-product bound
                # 128 * 2^-24 * sum|q_d k_d|, about 1e-3 for these N(0, 1) vectors.
                if got != want:
                    diff = set(got) ^ set(want)
                    kth = min(scores[b] for b in want if b >= 0)
                    assert all(abs(scores[b] - kth) < 1e-3 for b in diff), (t, h, got, want)
            expect = oracle_attention(from_bf16(q[t]), k, v, position, topk[:, t])
            got = from_bf16(out[t])
            err = max(err, np.abs(got - expect).max())
            honest = max(honest, np.abs(from_bf16(to_bf16(expect.astype(np.float32))) - expect).max())
    assert err <= 2 * honest + 1e-6, (err, honest)
    assert np.isfinite(lse).all()


def test_full_coverage_sparse_equals_dense():
    config, cm, data, cu, lens, table, q, iq = make_batch([700], [6], seed=2)
    assert flashmsa.selects_every_block(config, 700)  # 6 blocks of the top-16
    assert not flashmsa.selects_every_block(config, 16 * 128 + 1)
    topk = flashmsa.index_prefill(config, iq, cm.index_cache, cu, lens, table)
    sparse = np.zeros((6, HQ, D), dtype=np.uint16)
    dense = np.zeros_like(sparse)
    flashmsa.sparse_attention_prefill(config, q, cm.kv_cache, cu, lens, table, topk, sparse)
    flashmsa.dense_attention(config, q, cm.kv_cache, cu, lens, table, dense)
    assert (sparse == dense).all()


def test_decode_with_padding_and_mxfp8_output():
    config, cm, data, _, _, table, q, iq = make_batch([900, 130], [2, 2], seed=3)
    lens = np.asarray([900, 0], dtype=np.int32)  # request 1 becomes a padding row
    topk = flashmsa.index_decode(config, iq, cm.index_cache, lens, table, decode_query_len=2)
    assert (topk[:, 2:] == -1).all()
    out = np.zeros((4, HQ, D), dtype=np.uint16)
    lse = np.zeros((4, HQ), dtype=np.float32)
    flashmsa.sparse_attention_decode(config, q, cm.kv_cache, lens, table, topk, out,
                                     decode_query_len=2, lse=lse)
    assert (out[2:] == 0).all() and np.isneginf(lse[2:]).all()
    codes = np.zeros((4, HQ * D), dtype=np.uint8)
    scales = np.zeros((4, HQ * D // 32), dtype=np.uint8)
    flashmsa.sparse_attention_decode(config, q, cm.kv_cache, lens, table, topk, codes,
                                     decode_query_len=2, mxfp8_scales=scales)
    # E4M3 decode of the codes times 2^(scale - 127) reproduces the bf16 output to fp8 precision.
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp.astype(int) - 7))
    value = sign * mag * np.repeat(2.0 ** (scales.astype(int) - 127), 32, axis=1)
    ref = from_bf16(out).reshape(4, -1)
    assert np.allclose(value[:2], ref[:2], rtol=2 ** -3, atol=2.0 ** -9 * np.abs(ref[:2]).max())



def test_decode_step_equals_index_decode_then_attention():
    config, cm, _, _, _, table, q, iq = make_batch([900, 130, 2000], [2, 2, 2], seed=4)
    lens = np.asarray([900, 0, 2000], dtype=np.int32)  # request 1 becomes a padding row
    for dql in (1, 2):
        rows = 3 * dql
        want_topk = flashmsa.index_decode(config, iq[:rows], cm.index_cache, lens, table,
                                          decode_query_len=dql)
        want_out = np.full((rows, HQ, D), 0xFFFF, dtype=np.uint16)
        want_lse = np.full((rows, HQ), 777.0, dtype=np.float32)
        flashmsa.sparse_attention_decode(config, q[:rows], cm.kv_cache, lens, table, want_topk,
                                         want_out, decode_query_len=dql, lse=want_lse)
        out = np.full_like(want_out, 0xFFFF)
        lse = np.full_like(want_lse, 777.0)
        scores = np.full((HKV, rows, table.shape[1]), 555.0, dtype=np.float32)
        topk = flashmsa.sparse_decode_step(config, iq[:rows], cm.index_cache, q[:rows],
                                           cm.kv_cache, lens, table, out, decode_query_len=dql,
                                           block_scores=scores, lse=lse)
        assert (topk == want_topk).all()
        assert (out == want_out).all() and (lse == want_lse).all()
        assert (scores != 555.0).all()  # every block score written (-inf past a row's blocks)
        given = np.full_like(topk, -7)
        assert flashmsa.sparse_decode_step(config, iq[:rows], cm.index_cache, q[:rows],
                                           cm.kv_cache, lens, table, out, decode_query_len=dql,
                                           topk=given) is not None
        assert (given == want_topk).all()
    with pytest.raises(ValueError, match="topk"):
        flashmsa.sparse_decode_step(config, iq[:3], cm.index_cache, q[:3], cm.kv_cache, lens,
                                    table, out[:3], topk=np.zeros((HKV, 3, 15), dtype=np.int32))

def test_argument_errors_name_the_argument():
    config, cm, data, cu, lens, table, q, iq = make_batch([200], [3], seed=4)
    with pytest.raises(ValueError, match=r"topk must have dtype int32, got int64"):
        flashmsa.sparse_attention_prefill(config, q, cm.kv_cache, cu, lens, table,
                                          np.zeros((4, 3, 16), dtype=np.int64),
                                          np.zeros((3, HQ, D), dtype=np.uint16))
    with pytest.raises(ValueError, match=r"out must have shape \[3, 64, 128\], got \[3, 64, 64\]"):
        flashmsa.dense_attention(config, q, cm.kv_cache, cu, lens, table,
                                 np.zeros((3, HQ, 64), dtype=np.uint16))
    with pytest.raises(ValueError, match="k: unsupported dtype"):
        flashmsa.insert_kv(cm.kv_cache, np.zeros((1, 4, 128), dtype=np.complex64),
                           np.zeros((1, 4, 128), dtype=np.float32), np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="layout must be one of"):
        flashmsa.CacheManager(config, num_pages=2, layout="paged")


def test_caller_owned_cache_arrays_are_used_in_place():
    config = flashmsa.Config()
    buf = np.zeros((2, HKV, BLOCK, 2 * D), dtype=np.uint16)  # vLLM's packed layout, bf16 bits
    kv = flashmsa.kv_cache("packed", "bf16", buf)
    k = to_bf16(np.full((1, HKV, D), 1.5, dtype=np.float32))
    v = to_bf16(np.full((1, HKV, D), -2.0, dtype=np.float32))
    flashmsa.insert_kv(kv, k, v, np.asarray([130], dtype=np.int64))  # page 1, offset 2
    assert (from_bf16(buf[1, :, 2, :D]) == 1.5).all() and (from_bf16(buf[1, :, 2, D:]) == -2).all()
    assert np.count_nonzero(buf) == HKV * 2 * D


def test_python_m_flashmsa_prints_version_and_backends():
    out = subprocess.run([sys.executable, "-m", "flashmsa"], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(f"flashmsa {flashmsa.__version__}\n")
    assert out.count(flashmsa.__version__) == 1
    assert "backend cpu        available" in out


def test_help_lists_every_operation_and_class():
    import pydoc
    text = pydoc.render_doc(flashmsa, renderer=pydoc.plaintext)
    for name in flashmsa.__all__:
        assert name in text, name
    for name in ("index_prefill", "sparse_attention_decode", "CacheManager", "Config"):
        assert getattr(flashmsa, name).__doc__, name


def test_torch_cpu_tensors_through_dlpack():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    config, cm, data, cu, lens, table, q, iq = make_batch([300], [4], seed=5)
    as_bf16 = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    topk_np = flashmsa.index_prefill(config, iq, cm.index_cache, cu, lens, table)
    topk_t = flashmsa.index_prefill(config, as_bf16(iq), cm.index_cache, torch.from_numpy(cu),
                                    torch.from_numpy(lens), torch.from_numpy(table))
    assert (np.asarray(topk_t) == topk_np).all()


def test_mixed_devices_get_a_clear_error():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    config = flashmsa.Config()
    cm = flashmsa.CacheManager(config, num_pages=2)
    k = torch.zeros((1, HKV, D), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="k must be on cpu, got cuda"):
        flashmsa.insert_kv(cm.kv_cache, k, k, torch.zeros(1, dtype=torch.int64, device="cuda"))


def test_config_keywords_repr_orders_and_tensor_parallel():
    c = flashmsa.Config(kv_cache_dtype="fp8_e4m3", sparse_topk_blocks=32, topk_order="score_desc")
    assert (c.kv_cache_dtype, c.sparse_topk_blocks, c.topk_order) == ("fp8_e4m3", 32, "score_desc")
    c.topk_order = flashmsa.TopkOrder.local_last  # the enum works as well as its name
    assert c.topk_order == "local_last"
    # The repr names every field and evaluates back to an equal config.
    text = repr(c)
    assert text.startswith("Config(algorithm='minimax_m3', ") and "sparse_topk_blocks=32" in text
    assert set(flashmsa.Config.FIELDS) == {f.split("=")[0] for f in text[7:-1].split(", ")}
    again = eval(text, {"Config": flashmsa.Config})
    assert repr(again) == text
    # Tensor parallelism: MiniMax-M3 at TP 8 is 8 q heads and 1 kv head per rank.
    rank = flashmsa.Config().for_tensor_parallel(8, 3)
    assert (rank.first_q_head, rank.first_kv_head, rank.first_index_head) == (24, 1, 1)
    assert (rank.config.num_attention_heads, rank.config.num_key_value_heads,
            rank.config.sparse_num_index_heads) == (8, 1, 1)
    rank.config.check()


def test_config_equality_pickling_and_the_index_dtype_keyword():
    import copy
    import pickle
    c = flashmsa.Config(index_cache_dtype="fp8_e4m3", kv_cache_dtype="nvfp4", softmax_scale=0.1)
    # One spelling: the keyword sets the fp8 indexer it implies, as set_index_cache_dtype does.
    assert (c.indexer_kv_dtype, c.implementation) == ("fp8", "msa") and c.validate() == []
    assert flashmsa.Config() == flashmsa.Config() and c != flashmsa.Config()
    for copied in (pickle.loads(pickle.dumps(c)), copy.copy(c), copy.deepcopy(c),
                   eval(repr(c), {"Config": flashmsa.Config})):
        assert copied == c and repr(copied) == repr(c)
    # A field set beside index_cache_dtype wins over what it implies (so does pickling's state).
    odd = flashmsa.Config(index_cache_dtype="fp8_e4m3", implementation="triton")
    assert odd.implementation == "triton" and pickle.loads(pickle.dumps(odd)) == odd
    c.sparse_topk_blocks = 8
    assert c != pickle.loads(pickle.dumps(flashmsa.Config(index_cache_dtype="fp8_e4m3")))


def test_bf16_helpers_round_to_nearest_even_and_errors_name_the_carrier():
    x = np.array([1.0, 1.00390625, 1.01171875, np.inf, np.nan, 3.4e38], np.float32)
    bits = flashmsa.to_bf16(x)
    assert bits.dtype == np.uint16
    assert list(bits[:3]) == [0x3F80, 0x3F80, 0x3F82]  # the two ties go to the even neighbour
    back = flashmsa.from_bf16(bits)
    assert back.dtype == np.float32 and back[0] == 1.0 and back[3] == np.inf
    assert np.isnan(back[4]) and back[5] == np.inf  # past bf16's largest finite, as RNE rounds
    cm = flashmsa.CacheManager(flashmsa.Config(), num_pages=2)
    with pytest.raises(ValueError, match=r"must have dtype bf16.*got fp32 \(numpy has no bf16: "
                                         r"pass its bits as uint16, flashmsa\.to_bf16\(x\)\)"):
        flashmsa.index_prefill(flashmsa.Config(), np.ones((1, HIDX, DI), np.float32),
                               cm.index_cache, np.int32([0, 1]), np.int32([1]),
                               np.int32([[0]]))


def test_caches_and_cache_manager_print_what_they_hold():
    cm = flashmsa.CacheManager(flashmsa.Config(kv_cache_dtype="fp8_e4m3"), num_pages=8)
    cm.append(cm.add_request(), 300)
    assert repr(cm.kv_cache) == ("KvCache(dtype='fp8_e4m3', device='cpu', num_pages=8, "
                                 "num_kv_heads=4, head_dim=128, page_size=128, k_scale=1.0, "
                                 "v_scale=1.0)")
    assert repr(cm.index_cache) == ("IndexCache(dtype='bf16', device='cpu', num_pages=8, "
                                    "index_dim=128, page_size=128)")
    assert repr(cm).startswith("CacheManager(requests=1, free_pages=5/8, free_index_pages=5/8, "
                               "kv_cache=KvCache(")


def test_readme_example_prefill_then_decode_runs():
    """examples/prefill_then_decode.py is the README's Python example: it must keep running."""
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "prefill_then_decode.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True).stdout
    assert "prefill: 300 tokens" in out and "equal to dense attention" in out


def test_type_stubs_are_current():
    """python/flashmsa/_flashmsa.pyi (editors complete the API from it) is what nanobind's
    stubgen writes for this build; regenerate it with
    .venv/bin/python -m nanobind.stubgen -q -m flashmsa._flashmsa -o python/flashmsa/_flashmsa.pyi
    """
    import pathlib
    import re
    import tempfile
    nanobind = pytest.importorskip("nanobind")
    root = pathlib.Path(__file__).resolve().parents[2]
    pinned = re.search(r"^nanobind==(\S+)", (root / "requirements-dev.txt").read_text(), re.M)
    if not pinned or nanobind.__version__ != pinned.group(1):
        pytest.skip(f"stubs are generated with nanobind {pinned.group(1) if pinned else '?'}, "
                    f"this is {nanobind.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "_flashmsa.pyi"
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "flashmsa._flashmsa",
                        "-o", str(out)], check=True)
        assert out.read_text() == (root / "python" / "flashmsa" / "_flashmsa.pyi").read_text(), \
            "python/flashmsa/_flashmsa.pyi is stale: regenerate it (see this test's docstring)"
