"""torch custom ops: equal to the direct calls, traceable by torch.compile(fullgraph=True), and
passing torch.library.opcheck. CPU tensors (the CUDA backend is not written yet). Skipped, with
the reason, where torch is not installed."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

import flashmsa  # noqa: E402

PAGES, HKV, D, DI = 24, 4, 128, 128


def make_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.zeros((PAGES, HKV, 128, 2 * D), dtype=torch.bfloat16)
    index = torch.zeros((PAGES, 128, DI), dtype=torch.bfloat16)
    lengths, queries = [2500, 300], [5, 3]
    perm = torch.randperm(PAGES, generator=g).to(torch.int32)
    table = torch.full((2, 20), -1, dtype=torch.int32)
    table[0, :20] = perm[:20]
    table[1, :3] = perm[20:23]
    kv_view = flashmsa.kv_cache("packed", "bf16", kv)
    index_view = flashmsa.index_cache_view("bf16", index)
    for r, n in enumerate(lengths):
        pos = torch.arange(n)
        slots = (table[r, pos // 128].to(torch.int64) * 128 + pos % 128).contiguous()
        k = torch.randn((n, HKV, D), generator=g).to(torch.bfloat16)
        v = torch.randn((n, HKV, D), generator=g).to(torch.bfloat16)
        ik = torch.randn((n, DI), generator=g).to(torch.bfloat16)
        flashmsa.insert_kv(kv_view, k, v, slots)
        flashmsa.insert_index_k(index_view, ik, slots)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn((8, 64, D), generator=g).to(torch.bfloat16)
    iq = torch.randn((8, 4, DI), generator=g).to(torch.bfloat16)
    return kv, index, cu, lens, table, q, iq


def test_ops_equal_direct_calls():
    kv, index, cu, lens, table, q, iq = make_inputs()
    topk = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
    direct = flashmsa.index_prefill(flashmsa.Config(), iq, flashmsa.index_cache_view("bf16", index),
                                    cu, lens, table)
    assert (topk.numpy() == direct).all()
    out = torch.empty_like(q)
    torch.ops.flashmsa.sparse_attention_prefill(q, kv, None, cu, lens, table, topk, out)
    ref = torch.empty_like(q)
    flashmsa.sparse_attention_prefill(flashmsa.Config(), q, flashmsa.kv_cache("packed", "bf16", kv),
                                      cu, lens, table, topk, ref)
    assert torch.equal(out, ref)


def test_torch_compile_fullgraph():
    kv, index, cu, lens, table, q, iq = make_inputs(1)

    def layer(q, iq, kv, index, cu, lens, table):
        topk = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
        out = torch.empty_like(q)
        torch.ops.flashmsa.sparse_attention_prefill(q, kv, None, cu, lens, table, topk, out)
        return out * 1.0

    eager = layer(q, iq, kv, index, cu, lens, table)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, iq, kv, index, cu, lens, table), eager)


def test_opcheck():
    kv, index, cu, lens, table, q, iq = make_inputs(2)
    torch.library.opcheck(torch.ops.flashmsa.index_prefill.default, (iq, index, cu, lens, table),
                          test_utils=("test_schema", "test_faketensor"))
    topk = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.flashmsa.sparse_attention_prefill.default,
                          (q, kv, None, cu, lens, table, topk, out),
                          test_utils=("test_schema", "test_faketensor"))
    dql_rows = torch.randn((4, 4, DI)).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.flashmsa.index_decode.default,
                          (dql_rows, index, lens, table, 2),
                          test_utils=("test_schema", "test_faketensor"))
