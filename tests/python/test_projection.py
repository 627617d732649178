"""The fused FP8 Q/K/V + index projection from Python: the packed weight of a tensor-parallel
rank traced to the layer's weights, and the CPU projection against numpy on the dequantized
operands (the C++ tests hold the layout for every rank of TP 1/2/4/8 and the FP8 bound)."""

import numpy as np
import pytest

import flashmsa
from test_flashmsa import from_bf16, to_bf16

HIDDEN = 96
E4M3_MAX = 448.0


def e4m3_values():
    """float value of every E4M3 code (NaN for 0x7F / 0xFF)."""
    v = np.empty(256, np.float64)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        if (c & 0x7F) == 0x7F:
            mag = np.nan
        else:
            mag = m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0**(e - 7)
        v[c] = -mag if c & 0x80 else mag
    return v


def layer(seed=0):
    rng = np.random.default_rng(seed)
    w = {name: to_bf16(rng.standard_normal((rows, HIDDEN)) * 2.0**rng.integers(-6, 3, (rows, 1)))
         for name, rows in (("q", 64 * 128), ("k", 4 * 128), ("v", 4 * 128), ("index_q", 4 * 128),
                            ("index_k", 128))}
    return w


def test_packed_channels_trace_to_the_layer_weights():
    c, w = flashmsa.Config(), layer()
    deq = e4m3_values()
    for tp, rank in ((1, 0), (2, 1), (8, 3), (8, 6)):
        weight, scale = flashmsa.pack_qkv_index_projection(c, tp, rank, **w)
        rank_config = c.for_tensor_parallel(tp, rank).config
        width = 128 * (rank_config.num_attention_heads + 2 * rank_config.num_key_value_heads
                       + rank_config.sparse_num_index_heads + 1)
        assert weight.shape == (width, HIDDEN)
        assert weight.dtype == np.uint8 and scale.dtype == np.float32
        for n in range(0, weight.shape[0], 37):
            source, row = flashmsa.projection_source(c, tp, rank, n)
            src = from_bf16(w[source][row]).astype(np.float64)
            assert scale[n] == np.float32(np.abs(src).max()) / np.float32(E4M3_MAX)
            err = np.abs(deq[weight[n]] * scale[n] - src)
            assert np.all(err <= np.abs(src) * 2.0**-4 + scale[n] * 2.0**-10), (tp, rank, n)
        # the rank's last channels are the replicated index key
        assert flashmsa.projection_source(c, tp, rank, weight.shape[0] - 1) == ("index_k", 127)


def test_cpu_projection_is_the_documented_computation():
    c, w = flashmsa.Config(), layer(1)
    weight, scale = flashmsa.pack_qkv_index_projection(c, 8, 5, **w)
    x = layer(2)["index_k"][:4]  # 4 tokens of bf16 hidden states
    y = flashmsa.project_qkv_index_cpu(weight, scale, x)
    assert y.shape == (4, weight.shape[0]) and y.dtype == np.uint16
    deq = e4m3_values()
    xf = from_bf16(x).astype(np.float32)
    x_scale = np.abs(xf).max(axis=1, keepdims=True) / np.float32(E4M3_MAX)
    x_codes = np.empty(xf.shape, np.uint8)  # E4M3 by nearest value (random data has no ties)
    table = deq.copy()
    table[np.isnan(table)] = np.inf
    for i, v in np.ndenumerate(xf / x_scale):
        x_codes[i] = np.argmin(np.abs(table - v))
    ref = (deq[x_codes] * x_scale) @ (deq[weight] * scale[:, None].astype(np.float64)).T
    mag = np.abs(deq[x_codes] * x_scale) @ np.abs(deq[weight] * scale[:, None]).T
    got = from_bf16(y).astype(np.float64)
    # fp32 accumulation (~1e-5 of the magnitude) and the bf16 store (2^-8 of the result)
    assert np.all(np.abs(got - ref) <= np.abs(ref) * 2.0**-8 + 1e-5 * mag)
    with pytest.raises(ValueError, match="hidden"):
        flashmsa.project_qkv_index_cpu(weight, scale, x[:, :-1])
    with pytest.raises(ValueError, match="tp_size"):
        flashmsa.pack_qkv_index_projection(c, 3, 0, **w)


def test_device_generic_entry_point_equals_the_cpu_projection():
    """project_qkv_index on host arrays is the CPU projection bit for bit, writing the caller's
    out; the CUDA path is compared with it by the GPU tests and the torch op test."""
    c, w = flashmsa.Config(), layer(3)
    weight, scale = flashmsa.pack_qkv_index_projection(c, 4, 2, **w)
    x = layer(4)["index_k"][:3]
    out = np.full((3, weight.shape[0]), 0xA5A5, np.uint16)
    flashmsa.project_qkv_index(weight, scale, x, out)
    assert np.array_equal(out, flashmsa.project_qkv_index_cpu(weight, scale, x))
    assert flashmsa.projection_workspace_bytes(64, 6144) >= 64 * 6144 + 64 * 4
    with pytest.raises(ValueError, match="out"):
        flashmsa.project_qkv_index(weight, scale, x, out[:, :-1])
    with pytest.raises(ValueError, match="scale"):
        flashmsa.project_qkv_index(weight, scale[:-1], x, out)


def test_torch_op_on_cuda_matches_the_cpu_projection():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for the torch op")
    c, w = flashmsa.Config(), layer(5)
    weight, scale = flashmsa.pack_qkv_index_projection(c, 8, 1, **w)
    x = layer(6)["index_k"][:16]
    want = from_bf16(flashmsa.project_qkv_index_cpu(weight, scale, x)).astype(np.float64)
    hidden = torch.from_numpy(x.astype(np.int16)).view(torch.bfloat16).cuda()
    got = torch.ops.flashmsa.project_qkv_index(hidden, torch.from_numpy(weight).cuda(),
                                               torch.from_numpy(scale).cuda())
    got = got.float().cpu().numpy().astype(np.float64)
    # The C++ GPU test's rule: twice (FlashAttention rule) the honest low-precision error of
    # the two sides: two bf16 roundings (2^-8 relative each), two fp32 sums (K 2^-24 sum |x w|
    # each) and Hopper's FP8 tensor-core accumulation (about 14 bits inside a k block: 2^-13
    # sum |x w|); |x| (1 + 2^-4) bounds a dequantized activation.
    deq = e4m3_values()
    mag = (np.abs(from_bf16(x)) * (1 + 2.0**-4)) @ np.abs(deq[weight] * scale[:, None]).T
    bound = 2 * (2 * np.abs(want) * 2.0**-8 + (2.0**-13 + 2 * HIDDEN * 2.0**-24) * mag)
    assert np.all(np.abs(got - want) <= bound)
