"""torch custom ops: equal to the direct calls, traceable by torch.compile(fullgraph=True), and
passing torch.library.opcheck, on CPU tensors; on CUDA tensors (where a GPU exists): equal to the
CPU backend, captured in a CUDA graph and replayed after the lengths change in place, and
compiled. Skipped, with the reason, where torch or a GPU is missing."""

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
    torch.ops.flashmsa.sparse_attention_prefill(q, kv, None, cu, lens, table, topk, out, None)
    ref = torch.empty_like(q)
    flashmsa.sparse_attention_prefill(flashmsa.Config(), q, flashmsa.kv_cache("packed", "bf16", kv),
                                      cu, lens, table, topk, ref)
    assert torch.equal(out, ref)


def prefill_layer(q, iq, kv, index, cu, lens, table):
    topk = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
    out = torch.empty_like(q)
    torch.ops.flashmsa.sparse_attention_prefill(q, kv, None, cu, lens, table, topk, out, None)
    return out * 1.0


def check_compiled_layer_equals_eager(device, backend):
    kv, index, cu, lens, table, q, iq = (t.to(device) for t in make_inputs(1))
    args = (q, iq, kv, index, cu, lens, table)
    compiled = torch.compile(prefill_layer, fullgraph=True, backend=backend)
    assert torch.equal(compiled(*args), prefill_layer(*args))


def test_torch_compile_fullgraph():
    check_compiled_layer_equals_eager("cpu", "eager")


def test_opcheck():
    kv, index, cu, lens, table, q, iq = make_inputs(2)
    torch.library.opcheck(torch.ops.flashmsa.index_prefill.default, (iq, index, cu, lens, table),
                          test_utils=("test_schema", "test_faketensor"))
    topk = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.flashmsa.sparse_attention_prefill.default,
                          (q, kv, None, cu, lens, table, topk, out, None),
                          test_utils=("test_schema", "test_faketensor"))
    dql_rows = torch.randn((4, 4, DI)).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.flashmsa.index_decode.default,
                          (dql_rows, index, lens, table, 2),
                          test_utils=("test_schema", "test_faketensor"))


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def assert_attention_close(got, want):
    # A wiring check (the C++ GPU tests hold the kernels to the FlashAttention rule against the
    # fp64 oracle): the CPU backend weights V with fp32 probabilities, the GPU with bf16 ones
    # (spec 5), and both round the output to bf16, so they may differ by a few bf16 ulps.
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2 ** -6, atol=2 ** -8)


@requires_cuda
def test_cuda_ops_match_the_cpu_backend():
    kv, index, cu, lens, table, q, iq = make_inputs(3)
    topk_cpu = torch.ops.flashmsa.index_prefill(iq, index, cu, lens, table)
    out_cpu = torch.empty_like(q)
    torch.ops.flashmsa.sparse_attention_prefill(q, kv, None, cu, lens, table, topk_cpu, out_cpu,
                                                None)
    kv_d, index_d, cu_d, lens_d, table_d, q_d, iq_d = (t.cuda() for t in
                                                        (kv, index, cu, lens, table, q, iq))
    topk = torch.ops.flashmsa.index_prefill(iq_d, index_d, cu_d, lens_d, table_d)
    assert torch.equal(topk.cpu(), topk_cpu)
    out = torch.full_like(q_d, float("nan"))
    torch.ops.flashmsa.sparse_attention_prefill(q_d, kv_d, None, cu_d, lens_d, table_d, topk, out,
                                                None)
    assert_attention_close(out, out_cpu)


@requires_cuda
def test_cuda_graph_decode_replays_after_the_lengths_change():
    kv, index, _, lens, table, q, iq = make_inputs(4)
    dql, rows = 2, 4
    kv_d, index_d, table_d = kv.cuda(), index.cuda(), table.cuda()
    lens_d = lens.clone().cuda()
    q_d, iq_d = q[:rows].cuda(), iq[:rows].cuda()
    out = torch.empty_like(q_d)

    def step():
        topk = torch.ops.flashmsa.index_decode(iq_d, index_d, lens_d, table_d, dql)
        torch.ops.flashmsa.sparse_attention_decode(q_d, kv_d, None, lens_d, table_d, topk, out,
                                                   None, None, dql)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for new_lens in ([2500, 300], [1800, 129], [0, 257]):  # 0: a padding request
        lens_cpu = torch.tensor(new_lens, dtype=torch.int32)
        lens_d.copy_(lens_cpu)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        topk_cpu = torch.ops.flashmsa.index_decode(iq[:rows], index, lens_cpu, table, dql)
        want = torch.empty_like(q[:rows])
        torch.ops.flashmsa.sparse_attention_decode(q[:rows], kv, None, lens_cpu, table, topk_cpu,
                                                   want, None, None, dql)
        assert_attention_close(out, want)


@requires_cuda
def test_torch_compile_fullgraph_cuda():
    check_compiled_layer_equals_eager("cuda", "aot_eager")


@requires_cuda
def test_direct_calls_on_cuda_tensors_run_on_the_current_torch_stream():
    kv, index, cu, lens, table, q, iq = make_inputs(6)
    config = flashmsa.Config()
    topk_cpu = flashmsa.index_prefill(config, iq, flashmsa.index_cache_view("bf16", index), cu,
                                      lens, table)
    want = torch.empty_like(q)
    flashmsa.sparse_attention_prefill(config, q, flashmsa.kv_cache("packed", "bf16", kv), cu,
                                      lens, table, torch.from_numpy(topk_cpu), want)
    kv_d, index_d, cu_d, lens_d, table_d, q_d, iq_d = (t.cuda() for t in
                                                        (kv, index, cu, lens, table, q, iq))
    # Insertion on the GPU writes the same bytes as on the CPU.
    fresh_cpu, fresh_gpu = torch.zeros_like(kv), torch.zeros_like(kv_d)
    k = torch.randn((3, HKV, D)).to(torch.bfloat16)
    slots = torch.tensor([5, 130, 1000], dtype=torch.int64)
    flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", fresh_cpu), k, k, slots)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # no stream= and no workspace=: torch's current stream
        flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", fresh_gpu), k.cuda(), k.cuda(),
                           slots.cuda())
        topk = torch.full((4, 8, 16), -7, dtype=torch.int32, device="cuda")
        flashmsa.index_prefill(config, iq_d, flashmsa.index_cache_view("bf16", index_d), cu_d,
                               lens_d, table_d, out=topk)
        out = torch.full_like(q_d, float("nan"))
        flashmsa.sparse_attention_prefill(config, q_d, flashmsa.kv_cache("packed", "bf16", kv_d),
                                          cu_d, lens_d, table_d, topk, out)
    side.synchronize()
    assert torch.equal(fresh_gpu.cpu(), fresh_cpu)
    assert (topk.cpu().numpy() == topk_cpu).all()
    assert_attention_close(out, want)


WIDTH = 64 * D + 2 * HKV * D + 4 * DI + DI  # the producer's input row


def producer_inputs(seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    t = 6
    qkv = torch.randn((t, WIDTH), generator=g).to(torch.bfloat16)
    weights = [(0.1 * torch.randn(D, generator=g)).to(torch.bfloat16) for _ in range(4)]
    positions = torch.tensor([0, 1, 2, 130, 131, 700], dtype=torch.int64)
    slots = torch.tensor([5, 6, 7, 300, -1, 900], dtype=torch.int64)  # -1: not written
    return [x.to(device) for x in (qkv, *weights, positions, slots)]


def run_producer_op(inputs, device="cpu"):
    kv = torch.zeros((PAGES, HKV, 128, 2 * D), dtype=torch.bfloat16, device=device)
    index = torch.zeros((PAGES, 128, DI), dtype=torch.bfloat16, device=device)
    q = torch.empty((inputs[0].shape[0], 64, D), dtype=torch.bfloat16, device=device)
    iq = torch.empty((inputs[0].shape[0], 4, DI), dtype=torch.bfloat16, device=device)
    torch.ops.flashmsa.produce_qkv_index(*inputs, kv, None, None, None, index, None, q, iq)
    return kv, index, q, iq


def test_producer_insert_and_dense_ops_equal_direct_calls():
    inputs = producer_inputs(7)
    kv, index, q, iq = run_producer_op(inputs)
    kv2, index2 = torch.zeros_like(kv), torch.zeros_like(index)
    q2, iq2 = torch.empty_like(q), torch.empty_like(iq)
    flashmsa.produce_qkv_index(flashmsa.Config(), *inputs, flashmsa.kv_cache("packed", "bf16", kv2),
                               flashmsa.index_cache_view("bf16", index2), q2, iq2)
    assert torch.equal(kv, kv2) and torch.equal(index, index2)
    assert torch.equal(q, q2) and torch.equal(iq, iq2)

    k = torch.randn((3, HKV, D)).to(torch.bfloat16)
    ik = torch.randn((3, DI)).to(torch.bfloat16)
    slots = torch.tensor([9, -1, 1001], dtype=torch.int64)
    torch.ops.flashmsa.insert_kv(k, k, slots, kv, None, None, None)
    torch.ops.flashmsa.insert_index_k(ik, slots, index, None)
    flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", kv2), k, k, slots)
    flashmsa.insert_index_k(flashmsa.index_cache_view("bf16", index2), ik, slots)
    assert torch.equal(kv, kv2) and torch.equal(index, index2)

    kv, index, cu, lens, table, q, iq = make_inputs(8)
    out, ref = torch.empty_like(q), torch.empty_like(q)
    torch.ops.flashmsa.dense_attention(q, kv, None, cu, lens, table, out, None)
    flashmsa.dense_attention(flashmsa.Config(), q, flashmsa.kv_cache("packed", "bf16", kv), cu,
                             lens, table, ref)
    assert torch.equal(out, ref)


def test_opcheck_producer_insert_dense():
    inputs = producer_inputs(9)
    kv = torch.zeros((PAGES, HKV, 128, 2 * D), dtype=torch.bfloat16)
    index = torch.zeros((PAGES, 128, DI), dtype=torch.bfloat16)
    q = torch.empty((6, 64, D), dtype=torch.bfloat16)
    iq = torch.empty((6, 4, DI), dtype=torch.bfloat16)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.flashmsa.produce_qkv_index.default,
                          (*inputs, kv, None, None, None, index, None, q, iq),
                          test_utils=checks)
    k = torch.randn((2, HKV, D)).to(torch.bfloat16)
    slots = torch.tensor([3, 4], dtype=torch.int64)
    torch.library.opcheck(torch.ops.flashmsa.insert_kv.default,
                          (k, k, slots, kv, None, None, None), test_utils=checks)
    torch.library.opcheck(torch.ops.flashmsa.insert_index_k.default,
                          (torch.randn((2, DI)).to(torch.bfloat16), slots, index, None),
                          test_utils=checks)
    kv, index, cu, lens, table, q, iq = make_inputs(10)
    torch.library.opcheck(torch.ops.flashmsa.dense_attention.default,
                          (q, kv, None, cu, lens, table, torch.empty_like(q), None),
                          test_utils=checks)


@requires_cuda
def test_producer_op_on_cuda_matches_the_cpu_within_one_ulp():
    cpu = run_producer_op(producer_inputs(11))
    gpu = run_producer_op(producer_inputs(11, "cuda"), "cuda")
    # spec 3: engines differ by one bf16 ulp here (norm output rounding); the C++ tests hold
    # both backends to the fp64 oracle. V passes unchanged: the caches' V halves must be equal.
    assert torch.equal(gpu[0][..., D:].cpu(), cpu[0][..., D:])
    for got, want in zip(gpu, cpu):  # one bf16 ulp is at most 2^-7 of the value
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2 ** -7, atol=0)


def run_decode_outputs(kv, index, lens, table, q, iq, layout):
    """bf16 output + lse, and the MXFP8 output of the same decode call, through the torch ops."""
    dql, rows = 2, 4
    topk = torch.ops.flashmsa.index_decode(iq[:rows], index, lens, table, dql)
    out = torch.empty_like(q[:rows])
    lse = torch.full((rows, 64), 777.0, device=q.device)
    torch.ops.flashmsa.sparse_attention_decode(q[:rows], kv, None, lens, table, topk, out, lse,
                                               None, dql)
    codes = torch.full((rows, 64 * D), 0xAA, dtype=torch.uint8, device=q.device)
    scale_bytes = rows * 256 if layout == "row_major" else 128 * 256
    scales = torch.full((scale_bytes,), 0xAA, dtype=torch.uint8, device=q.device)
    scales_arg = scales.view(rows, 256) if layout == "row_major" else scales
    torch.ops.flashmsa.sparse_attention_decode(q[:rows], kv, None, lens, table, topk, codes, None,
                                               scales_arg, dql, scale_layout=layout)
    return topk, out, lse, codes, scales


@pytest.mark.parametrize("layout", ["row_major", "swizzled"])
def test_decode_op_lse_and_mxfp8_equal_the_direct_call(layout):
    kv, index, _, lens, table, q, iq = make_inputs(12)
    topk, out, lse, codes, scales = run_decode_outputs(kv, index, lens, table, q, iq, layout)
    config, cache = flashmsa.Config(), flashmsa.kv_cache("packed", "bf16", kv)
    want_out, want_lse = torch.empty_like(out), torch.empty_like(lse)
    flashmsa.sparse_attention_decode(config, q[:4], cache, lens, table, topk, want_out, 2,
                                     lse=want_lse)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    want_codes, want_scales = torch.empty_like(codes), torch.full_like(scales, 0xAA)
    flashmsa.sparse_attention_decode(
        config, q[:4], cache, lens, table, topk, want_codes, 2,
        mxfp8_scales=want_scales.view(4, 256) if layout == "row_major" else want_scales,
        scale_layout=layout)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    torch.library.opcheck(torch.ops.flashmsa.sparse_attention_decode.default,
                          (q[:4], kv, None, lens, table, topk, codes, None,
                           scales.view(4, 256) if layout == "row_major" else scales, 2),
                          {"scale_layout": layout},
                          test_utils=("test_schema", "test_faketensor"))


@requires_cuda
def test_decode_op_lse_and_mxfp8_on_cuda_match_the_cpu():
    inputs = make_inputs(13)
    picks = (0, 1, 3, 4, 5, 6)  # kv, index, lens, table, q, iq
    cpu = run_decode_outputs(*[inputs[i] for i in picks], "row_major")
    topk, out, lse, codes, scales = run_decode_outputs(*[inputs[i].cuda() for i in picks],
                                                       "row_major")
    assert torch.equal(topk.cpu(), cpu[0])  # same selections
    assert_attention_close(out, cpu[1])
    # lse: each backend is within the C++ tests' bound of fp64 (2 x 8 fp32 ulps at |lse| <= 16,
    # about 2e-5), so they are within twice that of each other.
    torch.testing.assert_close(lse.cpu(), cpu[2], rtol=0, atol=4e-5)
    # The MXFP8 codes decode to the GPU's own bf16 output within E4M3 rounding: half an ulp
    # (2^-4 relative) for normal codes, half the subnormal step (2^-10 of the group scale) below.
    x = out.float().reshape(4, 64 * D).cpu()
    scale = torch.pow(2.0, scales.view(4, 256).cpu().float() - 127).repeat_interleave(32, dim=1)
    decoded = codes.cpu().view(torch.float8_e4m3fn).float() * scale
    assert torch.all((decoded - x).abs() <= x.abs() * 2 ** -4 + scale * 2 ** -10)


# Shapes the ops must take from their tensors: MiniMax-M3 whole, one rank of tensor parallelism 8
# (8 q heads over 1 kv head and 1 index head, the kv heads replicated), and NVFP4 main and index
# caches (whose scales are tensors of their own), alone and on such a rank.
LAYERS = {
    "m3_bf16": (64, 4, 4, "bf16", "bf16"),
    "tp8_rank_bf16": (8, 1, 1, "bf16", "bf16"),
    "m3_nvfp4": (64, 4, 4, "nvfp4", "nvfp4"),
    "tp8_rank_nvfp4": (8, 1, 1, "nvfp4", "nvfp4"),
}


class Layer:
    """One layer's shapes and caches; `op_caches` are the torch ops' cache arguments."""

    def __init__(self, name, device="cpu"):
        self.hq, self.hkv, self.hidx, self.kv_dtype, self.index_dtype = LAYERS[name]
        nvfp4, index_nvfp4 = self.kv_dtype == "nvfp4", self.index_dtype == "nvfp4"
        u8 = dict(dtype=torch.uint8, device=device)
        bf16 = dict(dtype=torch.bfloat16, device=device)
        self.kv = (torch.zeros((PAGES, self.hkv, 128, D), **u8) if nvfp4 else
                   torch.zeros((PAGES, self.hkv, 128, 2 * D), **bf16))
        self.kv_scales = torch.zeros((PAGES, self.hkv, 128, 2 * D // 16), **u8) if nvfp4 else None
        self.index = (torch.zeros((PAGES, 128, DI // 2), **u8) if index_nvfp4 else
                      torch.zeros((PAGES, 128, DI), **bf16))
        self.index_scales = torch.zeros((PAGES, 128, DI // 16), **u8) if index_nvfp4 else None

    def config(self):
        return flashmsa.Config(num_attention_heads=self.hq, num_key_value_heads=self.hkv,
                               sparse_num_index_heads=self.hidx, kv_cache_dtype=self.kv_dtype,
                               index_cache_dtype=self.index_dtype)

    def kv_view(self):
        return flashmsa.kv_cache("packed", self.kv_dtype, self.kv, k_scales=self.kv_scales)

    def index_view(self):
        return flashmsa.index_cache_view(self.index_dtype, self.index, self.index_scales)

    def kv_args(self):
        return {"kv_dtype": self.kv_dtype, "kv_scales": self.kv_scales}

    def index_args(self):
        return {"index_dtype": self.index_dtype, "index_scales": self.index_scales}

    def width(self):
        return self.hq * D + 2 * self.hkv * D + self.hidx * DI + DI


def layer_batch(layer, seed):
    """A two-request prefill batch for `layer`: table, lengths, and random rows of every input."""
    g = torch.Generator().manual_seed(seed)
    lengths, queries = [2500, 300], [5, 3]
    perm = torch.randperm(PAGES, generator=g).to(torch.int32)
    table = torch.full((2, 20), -1, dtype=torch.int32)
    table[0, :20], table[1, :3] = perm[:20], perm[20:23]
    rows = []
    for r, n in enumerate(lengths):
        pos = torch.arange(n)
        slots = (table[r, pos // 128].to(torch.int64) * 128 + pos % 128).contiguous()
        rows.append([slots] + [torch.randn(s, generator=g).to(torch.bfloat16) for s in
                               ((n, layer.hkv, D), (n, layer.hkv, D), (n, DI))])
    t = sum(queries)
    q = torch.randn((t, layer.hq, D), generator=g).to(torch.bfloat16)
    iq = torch.randn((t, layer.hidx, DI), generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    return rows, cu, torch.tensor(lengths, dtype=torch.int32), table, q, iq


def run_layer_ops(layer, batch, device="cpu"):
    """Inserts, both index ops and the three attention ops through torch.ops.flashmsa on
    `device`; returns every output (CPU tensors), the caches included."""
    rows, cu, lens, table, q, iq = (batch[0],) + tuple(t.to(device) for t in batch[1:])
    for slots, k, v, ik in rows:
        k, v, ik, slots = k.to(device), v.to(device), ik.to(device), slots.to(device)
        torch.ops.flashmsa.insert_kv(k, v, slots, layer.kv, None, layer.kv_scales, None,
                                     kv_dtype=layer.kv_dtype)
        torch.ops.flashmsa.insert_index_k(ik, slots, layer.index, layer.index_scales,
                                          index_dtype=layer.index_dtype)
    topk = torch.ops.flashmsa.index_prefill(iq, layer.index, cu, lens, table,
                                            **layer.index_args())
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], 777.0, device=device)
    torch.ops.flashmsa.sparse_attention_prefill(q, layer.kv, None, cu, lens, table, topk, out, lse,
                                                **layer.kv_args())
    dense = torch.full_like(q, float("nan"))
    torch.ops.flashmsa.dense_attention(q, layer.kv, None, cu, lens, table, dense, None,
                                       **layer.kv_args())
    dql, rows_d = 2, 4  # two requests, two speculative rows each
    topk_d = torch.ops.flashmsa.index_decode(iq[:rows_d], layer.index, lens, table, dql,
                                             **layer.index_args())
    out_d = torch.full_like(q[:rows_d], float("nan"))
    torch.ops.flashmsa.sparse_attention_decode(q[:rows_d], layer.kv, None, lens, table, topk_d,
                                               out_d, None, None, dql, **layer.kv_args())
    caches = [layer.kv, layer.index] + [s for s in (layer.kv_scales, layer.index_scales)
                                        if s is not None]
    return [t.cpu() for t in [topk, out, lse, dense, topk_d, out_d] + caches]


def run_layer_direct(layer, batch):
    """The same as run_layer_ops through the direct calls (CPU), with the layer's Config."""
    rows, cu, lens, table, q, iq = batch
    c, kv, index = layer.config(), layer.kv_view(), layer.index_view()
    for slots, k, v, ik in rows:
        flashmsa.insert_kv(kv, k, v, slots)
        flashmsa.insert_index_k(index, ik, slots)
    topk = torch.from_numpy(flashmsa.index_prefill(c, iq, index, cu, lens, table))
    out, lse, dense = torch.empty_like(q), torch.empty(q.shape[:2]), torch.empty_like(q)
    flashmsa.sparse_attention_prefill(c, q, kv, cu, lens, table, topk, out, lse=lse)
    flashmsa.dense_attention(c, q, kv, cu, lens, table, dense)
    topk_d = torch.from_numpy(flashmsa.index_decode(c, iq[:4], index, lens, table, 2))
    out_d = torch.empty_like(q[:4])
    flashmsa.sparse_attention_decode(c, q[:4], kv, lens, table, topk_d, out_d, 2)
    caches = [layer.kv, layer.index] + [s for s in (layer.kv_scales, layer.index_scales)
                                        if s is not None]
    return [topk, out, lse, dense, topk_d, out_d] + caches


@pytest.mark.parametrize("name", LAYERS)
def test_ops_take_heads_and_nvfp4_scales_from_the_tensors(name):
    batch = layer_batch(Layer(name), 20)
    got = run_layer_ops(Layer(name), batch)
    want = run_layer_direct(Layer(name), batch)
    hkv, rows = LAYERS[name][1], batch[4].shape[0]
    assert got[0].shape == (hkv, rows, 16) and got[4].shape == (hkv, 4, 16)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("name", LAYERS)
def test_producer_op_takes_heads_and_nvfp4_scales_from_the_tensors(name):
    g = torch.Generator().manual_seed(21)
    layer, direct = Layer(name), Layer(name)
    t = 6
    qkv = torch.randn((t, layer.width()), generator=g).to(torch.bfloat16)
    weights = [(0.1 * torch.randn(n, generator=g)).to(torch.bfloat16) for n in (D, D, DI, DI)]
    positions = torch.tensor([0, 1, 2, 130, 131, 700], dtype=torch.int64)
    slots = torch.tensor([5, 6, 7, 300, -1, 900], dtype=torch.int64)
    q, iq = (torch.empty((t, layer.hq, D), dtype=torch.bfloat16),
             torch.empty((t, layer.hidx, DI), dtype=torch.bfloat16))
    args = (qkv, *weights, positions, slots, layer.kv, None, layer.kv_scales, None, layer.index,
            layer.index_scales, q, iq)
    kwargs = {"kv_dtype": layer.kv_dtype, "index_dtype": layer.index_dtype}
    torch.ops.flashmsa.produce_qkv_index(*args, **kwargs)
    q2, iq2 = torch.empty_like(q), torch.empty_like(iq)
    flashmsa.produce_qkv_index(direct.config(), qkv, *weights, positions, slots, direct.kv_view(),
                               direct.index_view(), q2, iq2)
    assert torch.equal(q, q2) and torch.equal(iq, iq2)
    assert torch.equal(layer.kv, direct.kv) and torch.equal(layer.index, direct.index)
    if layer.kv_scales is not None:
        assert torch.equal(layer.kv_scales, direct.kv_scales)
        assert torch.equal(layer.index_scales, direct.index_scales)
    torch.library.opcheck(torch.ops.flashmsa.produce_qkv_index.default, args, kwargs,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("name", ["tp8_rank_nvfp4"])
def test_opcheck_with_rank_heads_and_nvfp4_scales(name):
    layer = Layer(name)
    rows, cu, lens, table, q, iq = layer_batch(layer, 22)
    checks = ("test_schema", "test_faketensor")
    slots, k, v, ik = rows[0]
    torch.library.opcheck(torch.ops.flashmsa.insert_kv.default,
                          (k, v, slots, layer.kv, None, layer.kv_scales, None),
                          {"kv_dtype": layer.kv_dtype}, test_utils=checks)
    torch.library.opcheck(torch.ops.flashmsa.insert_index_k.default,
                          (ik, slots, layer.index, layer.index_scales),
                          {"index_dtype": layer.index_dtype}, test_utils=checks)
    torch.library.opcheck(torch.ops.flashmsa.index_prefill.default,
                          (iq, layer.index, cu, lens, table), layer.index_args(),
                          test_utils=checks)
    topk = torch.ops.flashmsa.index_prefill(iq, layer.index, cu, lens, table,
                                            **layer.index_args())
    torch.library.opcheck(torch.ops.flashmsa.sparse_attention_prefill.default,
                          (q, layer.kv, None, cu, lens, table, topk, torch.empty_like(q), None),
                          layer.kv_args(), test_utils=checks)
    torch.library.opcheck(torch.ops.flashmsa.index_decode.default,
                          (iq[:4], layer.index, lens, table, 2), layer.index_args(),
                          test_utils=checks)


def test_index_ops_take_the_kv_head_count_when_index_heads_are_a_multiple():
    # Two index heads per kv head: the output has one top-k list per kv head.
    layer = Layer("m3_bf16")
    rows, cu, lens, table, q, iq = layer_batch(layer, 23)
    iq8 = torch.cat([iq, iq], dim=1)
    topk = torch.ops.flashmsa.index_prefill(iq8, layer.index, cu, lens, table, num_kv_heads=4)
    c = flashmsa.Config(sparse_num_index_heads=8)
    want = flashmsa.index_prefill(c, iq8, layer.index_view(), cu, lens, table)
    assert topk.shape == (4, iq.shape[0], 16) and (topk.numpy() == want).all()


@requires_cuda
@pytest.mark.parametrize("name", LAYERS)
def test_cuda_ops_with_rank_heads_and_nvfp4_caches_match_the_cpu(name):
    batch = layer_batch(Layer(name), 24)
    want = run_layer_ops(Layer(name), batch)
    got = run_layer_ops(Layer(name, "cuda"), batch, "cuda")
    topk, out, lse, dense, topk_d, out_d = range(6)
    assert torch.equal(got[topk], want[topk]) and torch.equal(got[topk_d], want[topk_d])
    for i in (out, dense, out_d):
        assert_attention_close(got[i], want[i])
    torch.testing.assert_close(got[lse], want[lse], rtol=0, atol=4e-5)  # as the decode test
    for g, w in zip(got[6:], want[6:]):  # insertion writes the same bytes on both backends
        assert torch.equal(g, w)



def run_decode_step(kv, index, lens, table, q, iq, dql, rows):
    """(top-k, out, lse, block scores) of sparse_decode_step, then (top-k, out, lse) of
    index_decode and sparse_attention_decode on the same tensors, through the torch ops."""
    out = torch.full_like(q[:rows], float("nan"))
    lse = torch.full((rows, 64), 777.0, device=q.device)
    scores = torch.full((4, rows, table.shape[1]), 555.0, device=q.device)
    topk = torch.ops.flashmsa.sparse_decode_step(iq[:rows], index, q[:rows], kv, None, lens,
                                                 table, out, lse, None, scores, dql)
    two_out = torch.full_like(q[:rows], float("nan"))
    two_lse = torch.full((rows, 64), 777.0, device=q.device)
    two_topk = torch.ops.flashmsa.index_decode(iq[:rows], index, lens, table, dql)
    torch.ops.flashmsa.sparse_attention_decode(q[:rows], kv, None, lens, table, two_topk, two_out,
                                               two_lse, None, dql)
    return (topk, out, lse, scores), (two_topk, two_out, two_lse)


def test_decode_step_op_equals_the_two_ops():
    kv, index, _, lens, table, q, iq = make_inputs(13)
    for dql, rows in ((1, 2), (2, 4)):
        (topk, out, lse, scores), two = run_decode_step(kv, index, lens, table, q, iq, dql, rows)
        assert torch.equal(topk, two[0]) and torch.equal(out, two[1]) and torch.equal(lse, two[2])
        assert not (scores == 555.0).any()  # every block score written (-inf past the row's)
    # The direct call: the same, its top-k returned as a new array.
    config = flashmsa.Config()
    out = torch.empty_like(q[:2])
    ids = flashmsa.sparse_decode_step(config, iq[:2], flashmsa.index_cache_view("bf16", index),
                                      q[:2], flashmsa.kv_cache("packed", "bf16", kv), lens, table,
                                      out)
    (topk, want, _, _), _ = run_decode_step(kv, index, lens, table, q, iq, 1, 2)
    assert (ids == topk.numpy()).all() and torch.equal(out, want)
    with pytest.raises(ValueError, match="topk"):
        flashmsa.sparse_decode_step(config, iq[:2], flashmsa.index_cache_view("bf16", index),
                                    q[:2], flashmsa.kv_cache("packed", "bf16", kv), lens, table,
                                    out, topk=torch.empty((4, 2, 15), dtype=torch.int32))
    torch.library.opcheck(torch.ops.flashmsa.sparse_decode_step.default,
                          (iq[:2], index, q[:2], kv, None, lens, table, out, None, None, None),
                          test_utils=("test_schema", "test_faketensor"))


@requires_cuda
def test_decode_step_op_on_cuda_equals_the_two_ops_and_the_cpu():
    kv, index, _, lens, table, q, iq = make_inputs(14)
    cpu = run_decode_step(kv, index, lens, table, q, iq, 1, 2)
    for dql, rows in ((1, 2), (2, 4)):
        args = (t.cuda() for t in (kv, index, lens, table, q, iq))
        (topk, out, lse, scores), two = run_decode_step(*args, dql, rows)
        # bit for bit the two calls' outputs (same selection, same union order)
        assert torch.equal(topk, two[0]) and torch.equal(out, two[1]) and torch.equal(lse, two[2])
        assert not (scores == 555.0).any()
        if dql == 1:  # the CPU backend's selection exactly; its attention within tolerance
            assert torch.equal(topk.cpu(), cpu[0][0])
            assert_attention_close(out, cpu[0][1])


def test_torch_backend_example_runs():
    """examples/torch_backend.py (the engine-backend sketch the README points to) keeps running."""
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch_backend.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True).stdout
    assert "equal to dense attention" in out.splitlines()[-1]
