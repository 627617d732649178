"""A MiniMax-M3 sparse attention layer through FlashMSA's Python API, as an engine calls it:
a 300-token prompt is prefilled, then one token is decoded.

Per step: the cache manager hands out pages and slots, the fused producer normalises, rotates and
writes K / V / index-K into the caches (and returns q and index-q), the indexer picks each row's
blocks, the sparse attention reads only those. numpy has no bf16, so uint16 arrays carry bf16
bits. Runs on the CPU; torch CUDA tensors take the same calls on the GPU.

    python examples/prefill_then_decode.py
"""

import numpy as np

import flashmsa

HQ, HKV, D, HIDX, DI = 64, 4, 128, 4, 128  # MiniMax-M3
WIDTH = HQ * D + 2 * HKV * D + HIDX * DI + DI  # the fused projection's output per token
rng = np.random.default_rng(0)


bf16, from_bf16 = flashmsa.to_bf16, flashmsa.from_bf16  # float <-> bf16 bits (uint16)


config = flashmsa.Config()  # MiniMax-M3: top-16 of 128-token blocks
cm = flashmsa.CacheManager(config, num_pages=16)
norm_weights = [bf16(0.1 * rng.standard_normal(n)) for n in (D, D, DI, DI)]
max_blocks = 8


def produce(request, first, count):
    """The producer for `count` new tokens at positions first.. of `request`: fills the caches,
    returns q [count, 64, 128] and index-q [count, 4, 128] (bf16 bits)."""
    hidden = bf16(rng.standard_normal((count, WIDTH)))  # stands in for the QKV projection
    positions = np.arange(first, first + count, dtype=np.int64)
    q = np.zeros((count, HQ, D), np.uint16)
    iq = np.zeros((count, HIDX, DI), np.uint16)
    flashmsa.produce_qkv_index(config, hidden, *norm_weights, positions,
                               cm.slot_mapping(request, first, count), cm.kv_cache,
                               cm.index_cache, q, iq)
    return q, iq


# ---- Prefill: one request, a 300-token prompt ----
request = cm.add_request()
prompt = 300
cm.append(request, prompt)
q, iq = produce(request, 0, prompt)
table = cm.block_table([request], max_blocks)
cu_seqlens = np.array([0, prompt], np.int32)
seq_lens = np.array([prompt], np.int32)
topk = flashmsa.index_prefill(config, iq, cm.index_cache, cu_seqlens, seq_lens, table)
out = np.zeros((prompt, HQ, D), np.uint16)
flashmsa.sparse_attention_prefill(config, q, cm.kv_cache, cu_seqlens, seq_lens, table, topk, out)
print(f"prefill: {prompt} tokens, blocks chosen by the last row (kv head 0): "
      f"{[int(b) for b in topk[0, -1] if b >= 0]}")

# ---- Decode: one new token ----
cm.append(request, 1)
q1, iq1 = produce(request, prompt, 1)
seq_lens = np.array([prompt + 1], np.int32)
table = cm.block_table([request], max_blocks)
topk1 = flashmsa.index_decode(config, iq1, cm.index_cache, seq_lens, table, decode_query_len=1)
out1 = np.zeros((1, HQ, D), np.uint16)
flashmsa.sparse_attention_decode(config, q1, cm.kv_cache, seq_lens, table, topk1, out1)

# With 3 visible blocks (<= 16) every block is selected, so the sparse layer must equal dense
# attention over the same cache, bit for bit on the CPU.
dense = np.zeros_like(out1)
flashmsa.dense_attention(config, q1, cm.kv_cache, np.array([0, 1], np.int32), seq_lens, table,
                         dense)
assert (dense == out1).all(), "sparse decode differs from dense attention"
assert np.isfinite(from_bf16(out)).all() and np.isfinite(from_bf16(out1)).all()
print(f"decode: token {prompt}, output norm {np.linalg.norm(from_bf16(out1)):.3f}, "
      "equal to dense attention")
