"""FlashMSA: MiniMax-M3 sparse attention (MSA) for inference engines.

A thin Python layer over the C++ library. Arrays are passed through DLPack without copies:
numpy arrays (and CPU torch tensors) run on the CPU backend, CUDA tensors on the CUDA backend
on the current torch stream (`stream=` overrides it; index and attention ops take a uint8 device
`workspace` of index_workspace_bytes / attention_workspace_bytes bytes, allocated with torch when
left out; pass it, and `out`, to allocate nothing). numpy has no bfloat16 or fp8, so
uint16 arrays carry bf16 bits and uint8 arrays fp8 codes where an operation expects them
(`to_bf16` / `from_bf16` convert float arrays to and from those bits).

Errors: ValueError for bad arguments (the message names the argument, the expected and the actual
value), RuntimeError for configurations a backend cannot serve and for resource failures.

Shapes (T query rows, Hq = 64 q heads, Hkv = 4 kv heads, Hidx = 4 index heads, D = Di = 128):
  index_prefill(config, index_q [T, Hidx, Di], index_cache, cu_seqlens_q [B+1] int32,
                seq_lens [B] int32, block_table [B, max_blocks] int32) -> topk [Hkv, T, topk]
  sparse_attention_prefill(config, q [T, Hq, D], kv_cache, cu_seqlens_q, seq_lens, block_table,
                           topk, out [T, Hq, D], lse=[T, Hq] fp32)
  dense_attention(config, q, kv_cache, cu_seqlens_q, seq_lens, block_table, out, lse=None)
  selects_every_block(config, max_seq_len): whether every row of such a batch selects all its
                visible blocks, so that dense_attention gives the sparse rows without the indexer
  insert_kv(kv_cache, k [T, Hkv, D], v [T, Hkv, D], slot_mapping [T] int64)
  insert_index_k(index_cache, index_k [T, Di], slot_mapping [T] int64)
  index_decode / sparse_attention_decode: the same for uniform decode rows (seq_lens [B],
                block_table, decode_query_len); decode attention can emit MXFP8
  sparse_decode_step(config, index_q, index_cache, q, kv_cache, seq_lens, block_table, out,
                decode_query_len) -> topk: both decode ops in one call, the same outputs (CUDA:
                no top-k launch where the attention can select; one workspace of
                decode_workspace_bytes)
  produce_qkv_index: the fused norm / RoPE / cast / cache-insert producer
  pack_qkv_index_projection(config, tp_size, rank, q, k, v, index_q, index_k) -> (weight, scale):
                the fused FP8 projection's packed weight of one rank (E4M3 codes + per-channel
                scales, channels in the producer's row order); project_qkv_index_cpu runs it
  project_qkv_index(weight, scale, hidden [T, hidden] bf16, out [T, out_features] bf16): the
                projection on the arrays' device (CUDA: E4M3 quantization + FP8 GEMM)
help(flashmsa.<function>) gives each one's arguments.
"""

from ._flashmsa import (  # noqa: F401
    CacheManager,
    Config,
    IndexCache,
    attention_workspace_bytes,
    KvCache,
    TensorParallelRank,
    TopkOrder,
    backends,
    build_batch_metadata,
    build_info,
    decode_workspace_bytes,
    dense_attention,
    index_decode,
    index_cache_view,
    index_prefill,
    index_workspace_bytes,
    insert_index_k,
    insert_kv,
    kv_cache,
    pack_qkv_index_projection,
    produce_qkv_index,
    project_qkv_index,
    project_qkv_index_cpu,
    projection_source,
    projection_workspace_bytes,
    PROJECTION_LAYOUT_VERSION,
    selects_every_block,
    sparse_attention_decode,
    sparse_attention_prefill,
    sparse_decode_step,
    version,
)

from .bf16 import from_bf16, to_bf16  # noqa: E402
from . import _flashmsa as _C  # noqa: E402
from ._cuda_defaults import with_cuda_defaults as _with_cuda_defaults  # noqa: E402


def _index_ws(a):
    return _C.index_workspace_bytes(a["config"], a["index_q"].shape[0], a["seq_lens"].shape[0],
                                    a["block_table"].shape[1])


def _attention_ws(a):
    return _C.attention_workspace_bytes(a["config"], a["q"].shape[0], a["seq_lens"].shape[0])


_PREFILL = ["kv_or_index_cache", "cu_seqlens_q", "seq_lens", "block_table"]
_DECODE = ["kv_or_index_cache", "seq_lens", "block_table"]
index_prefill = _with_cuda_defaults(_C.index_prefill, ["config", "index_q"] + _PREFILL, _index_ws)
index_decode = _with_cuda_defaults(_C.index_decode, ["config", "index_q"] + _DECODE, _index_ws)
sparse_attention_prefill = _with_cuda_defaults(_C.sparse_attention_prefill,
                                               ["config", "q"] + _PREFILL, _attention_ws)
dense_attention = _with_cuda_defaults(_C.dense_attention, ["config", "q"] + _PREFILL,
                                      _attention_ws)
sparse_attention_decode = _with_cuda_defaults(_C.sparse_attention_decode,
                                              ["config", "q"] + _DECODE, _attention_ws)
sparse_decode_step = _with_cuda_defaults(
    _C.sparse_decode_step,
    ["config", "index_q", "index_cache", "q", "kv_cache", "seq_lens", "block_table", "out",
     "decode_query_len"],
    lambda a: _C.decode_workspace_bytes(a["config"], a["seq_lens"].shape[0],
                                        a.get("decode_query_len", 1), a["block_table"].shape[1]))
insert_kv = _with_cuda_defaults(_C.insert_kv, [])
insert_index_k = _with_cuda_defaults(_C.insert_index_k, [])
produce_qkv_index = _with_cuda_defaults(_C.produce_qkv_index, [])
project_qkv_index = _with_cuda_defaults(
    _C.project_qkv_index, ["weight", "scale", "hidden"],
    lambda a: _C.projection_workspace_bytes(a["hidden"].shape[0], a["hidden"].shape[1]))

__version__ = version()

# What `from flashmsa import *` and help(flashmsa) show: every operation and class.
__all__ = [
    "CacheManager", "Config", "IndexCache", "KvCache", "TensorParallelRank", "TopkOrder",
    "attention_workspace_bytes", "backends", "build_batch_metadata", "build_info",
    "decode_workspace_bytes", "dense_attention", "index_cache_view", "index_decode",
    "index_prefill", "index_workspace_bytes", "insert_index_k", "insert_kv", "kv_cache",
    "PROJECTION_LAYOUT_VERSION", "pack_qkv_index_projection", "produce_qkv_index",
    "project_qkv_index", "project_qkv_index_cpu", "projection_source",
    "projection_workspace_bytes", "selects_every_block", "sparse_attention_decode",
    "sparse_attention_prefill", "sparse_decode_step", "from_bf16", "to_bf16", "version",
]

try:  # torch custom ops (torch.ops.flashmsa.*), when torch is importable
    import torch as _torch  # noqa: F401
except ImportError:
    torch_ops = None
else:
    from . import torch_ops  # noqa: F401
