"""How an engine's attention backend calls FlashMSA through torch: a MiniMax-M3 sparse layer over
an engine-owned paged cache (plain torch tensors), one prefill of two ragged requests, then one
decode step, every op a `torch.ops.flashmsa.*` custom op called with keyword arguments.

The engine owns the caches, the block tables and the slot mappings; FlashMSA only reads and
writes the tensors it is given. On CPU tensors the ops run on the CPU backend (this script); the
same calls on CUDA tensors run on an H100 / H200 on the current torch stream, and the decode step
can be captured in a CUDA graph (see docs/integration.md).

    python examples/torch_backend.py        # needs torch (pip install .[torch])
"""

import torch

import flashmsa  # registers torch.ops.flashmsa.*  # noqa: F401

HQ, HKV, D, HIDX, DI, BLOCK = 64, 4, 128, 4, 128, 128  # MiniMax-M3


class SparseAttentionBackend:
    """The attention part of one sparse layer in an engine: caches allocated once, then
    prefill and decode forward calls on the engine's batch metadata."""

    def __init__(self, num_pages: int, device: str = "cpu"):
        # Packed layout: [pages, Hkv, 128 tokens, K | V]; the index-K side cache [pages, 128, Di].
        self.kv_cache = torch.zeros((num_pages, HKV, BLOCK, 2 * D), dtype=torch.bfloat16,
                                    device=device)
        self.index_cache = torch.zeros((num_pages, BLOCK, DI), dtype=torch.bfloat16,
                                       device=device)

    def write(self, k, v, index_k, slot_mapping):
        """The new tokens' K, V [T, Hkv, D] and index-K [T, Di] into the caches (slot = page *
        128 + offset; a negative slot writes nothing)."""
        torch.ops.flashmsa.insert_kv(k=k, v=v, slot_mapping=slot_mapping, kv_cache=self.kv_cache,
                                     kv_cache_v=None, kv_scales=None, kv_scales_v=None)
        torch.ops.flashmsa.insert_index_k(index_k=index_k, slot_mapping=slot_mapping,
                                          index_cache=self.index_cache, index_scales=None)

    def prefill(self, q, index_q, cu_seqlens_q, seq_lens, block_table):
        """Ragged prefill rows: q [T, Hq, D], index_q [T, Hidx, Di] -> attention output."""
        topk = torch.ops.flashmsa.index_prefill(
            index_q=index_q, index_cache=self.index_cache, cu_seqlens_q=cu_seqlens_q,
            seq_lens=seq_lens, block_table=block_table, topk=16)
        out = torch.empty_like(q)
        torch.ops.flashmsa.sparse_attention_prefill(
            q=q, kv_cache=self.kv_cache, kv_cache_v=None, cu_seqlens_q=cu_seqlens_q,
            seq_lens=seq_lens, block_table=block_table, topk=topk, out=out, lse=None)
        return out

    def decode(self, q, index_q, seq_lens, block_table):
        """One decode row a request: the indexer and the attention in one call."""
        out = torch.empty_like(q)
        torch.ops.flashmsa.sparse_decode_step(
            index_q=index_q, index_cache=self.index_cache, q=q, kv_cache=self.kv_cache,
            kv_cache_v=None, seq_lens=seq_lens, block_table=block_table, out=out, lse=None,
            mxfp8_scales=None, block_scores=None, decode_query_len=1, topk=16)
        return out

    def dense(self, q, cu_seqlens_q, seq_lens, block_table):
        """Dense causal attention over the same cache (the reference while top-k covers all)."""
        out = torch.empty_like(q)
        torch.ops.flashmsa.dense_attention(
            q=q, kv_cache=self.kv_cache, kv_cache_v=None, cu_seqlens_q=cu_seqlens_q,
            seq_lens=seq_lens, block_table=block_table, out=out, lse=None)
        return out


def slots(table_row, positions):
    """The engine's slot mapping: page of each position's block, times 128, plus its offset."""
    return table_row[positions // BLOCK].to(torch.int64) * BLOCK + positions % BLOCK


def main():
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(torch.bfloat16)

    backend = SparseAttentionBackend(num_pages=16)
    lengths = [700, 300]  # two prompts, prefilled in one ragged batch
    block_table = torch.full((2, 8), -1, dtype=torch.int32)
    block_table[0, :6] = torch.tensor([3, 9, 1, 12, 5, 7], dtype=torch.int32)
    block_table[1, :3] = torch.tensor([0, 14, 2], dtype=torch.int32)

    # ---- Prefill: both prompts in one call ----
    for r, n in enumerate(lengths):
        backend.write(randn(n, HKV, D), randn(n, HKV, D), randn(n, DI),
                      slots(block_table[r], torch.arange(n)))
    total = sum(lengths)
    cu_seqlens_q = torch.tensor([0, lengths[0], total], dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q, index_q = randn(total, HQ, D), randn(total, HIDX, DI)
    out = backend.prefill(q, index_q, cu_seqlens_q, seq_lens, block_table)
    # 700 tokens are 6 blocks: the top-16 keeps every block, so the sparse layer is dense
    # attention (bit for bit on the CPU backend).
    dense = backend.dense(q, cu_seqlens_q, seq_lens, block_table)
    assert torch.equal(out, dense), "sparse prefill differs from dense attention"
    print(f"prefill: {total} tokens of 2 requests, equal to dense attention")

    # ---- Decode: one new token a request ----
    new = torch.tensor(lengths)  # the new tokens' positions
    for r in range(2):
        backend.write(randn(1, HKV, D), randn(1, HKV, D), randn(1, DI),
                      slots(block_table[r], new[r:r + 1]))
    seq_lens = (new + 1).to(torch.int32)
    q, index_q = randn(2, HQ, D), randn(2, HIDX, DI)
    out = backend.decode(q, index_q, seq_lens, block_table)
    dense = backend.dense(q, torch.tensor([0, 1, 2], dtype=torch.int32), seq_lens, block_table)
    assert torch.equal(out, dense), "sparse decode differs from dense attention"
    print(f"decode: 2 requests, output norm {out.float().norm():.3f}, equal to dense attention")


if __name__ == "__main__":
    main()
