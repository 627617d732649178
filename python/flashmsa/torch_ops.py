"""FlashMSA operations as torch custom ops (``torch.ops.flashmsa.*``).

Registered when torch is importable (``import flashmsa`` does it), with fake implementations so
``torch.compile(fullgraph=True)`` traces through them. The caches are passed as the engine's own
tensors plus their layout, so nothing but tensors, ints, floats and strings crosses the op
boundary:

  kv_cache: the main cache tensor(s) in ``kv_layout`` ("packed": one [pages, Hkv, 128, 2D]
            tensor; "separate"/"token_major": pass ``kv_cache_v`` too; "stacked"), dtype
            ``kv_dtype`` (bf16, fp16, fp8_e4m3, fp8_e5m2).
  index_cache: [pages, 128, Di] bf16 or fp8_e4m3.

The layer configuration is MiniMax-M3's except for the arguments given (top-k, order, scales).
The attention ops take their optional outputs (``lse``, and ``mxfp8_scales`` for decode) as
required arguments, ``None`` for none: torch releases up to 2.11 drop a mutated argument left at
its default before bumping its version counter and fail with "tuple index out of range", so a
mutated tensor must never have a default.
Outputs are written into the ``out`` tensors the caller passes, so the ops allocate nothing but
the top-k result of the index ops and, for CUDA tensors, their device workspace (from torch's
caching allocator, so a captured CUDA graph keeps it). CUDA tensors run on the current torch
stream; the decode ops have a fixed grid and no host synchronisation, so they can be captured by
``torch.cuda.graphs`` and replayed after ``seq_lens`` / ``block_table`` change in place.
"""

from typing import Optional

import torch

from . import _flashmsa as _C

_ORDERS = {"ascending": _C.TopkOrder.ascending, "score_desc": _C.TopkOrder.score_desc,
           "local_last": _C.TopkOrder.local_last}


def _config(topk: int, topk_order: str, index_dtype: str, kv_dtype: str) -> "_C.Config":
    c = _C.Config()
    c.sparse_topk_blocks = topk
    if topk_order not in _ORDERS:
        raise ValueError(f"topk_order must be one of {', '.join(_ORDERS)}, got {topk_order!r}")
    c.topk_order = _ORDERS[topk_order]
    c.set_index_cache_dtype(index_dtype)
    c.kv_cache_dtype = kv_dtype
    return c


def _device_args(t: torch.Tensor, workspace_bytes=None) -> dict:
    """stream= (and workspace= when the op takes one) for a CUDA call; nothing for CPU tensors."""
    if t.device.type != "cuda":
        return {}
    extra = {"stream": torch.cuda.current_stream(t.device).cuda_stream}
    if workspace_bytes is not None:
        extra["workspace"] = torch.empty(max(1, workspace_bytes()), dtype=torch.uint8,
                                         device=t.device)
    return extra


def _index_device_args(c, index_q, seq_lens, block_table) -> dict:
    return _device_args(index_q, lambda: _C.index_workspace_bytes(
        c, index_q.shape[0], seq_lens.shape[0], block_table.shape[1]))


def _attention_device_args(c, q, seq_lens) -> dict:
    return _device_args(q, lambda: _C.attention_workspace_bytes(c, q.shape[0], seq_lens.shape[0]))


def _index_cache(index_cache: torch.Tensor, index_dtype: str):
    # An index cache is the same strided structure as a one-head "separate" main cache plane.
    return _C.index_cache_view(index_dtype, index_cache)


def _kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype, k_scale, v_scale):
    # Heads, head dim and pages come from the tensors' shapes (checked against the config by
    # the op itself).
    return _C.kv_cache(kv_layout, kv_dtype, kv_cache, kv_cache_v, k_scale=k_scale, v_scale=v_scale)


@torch.library.custom_op("flashmsa::index_prefill", mutates_args=())
def index_prefill(index_q: torch.Tensor, index_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int = 16,
                  topk_order: str = "ascending", index_dtype: str = "bf16") -> torch.Tensor:
    """Top-k block ids, int32 [4, T, topk], for index_q [T, 4, 128] over a ragged batch."""
    c = _config(topk, topk_order, index_dtype, "bf16")
    out = torch.empty((4, index_q.shape[0], topk), dtype=torch.int32, device=index_q.device)
    extra = _index_device_args(c, index_q, seq_lens, block_table)
    _C.index_prefill(c, index_q, _index_cache(index_cache, index_dtype), cu_seqlens_q, seq_lens,
                     block_table, out=out, **extra)
    return out


@index_prefill.register_fake
def _(index_q, index_cache, cu_seqlens_q, seq_lens, block_table, topk=16,
      topk_order="ascending", index_dtype="bf16"):
    return index_q.new_empty((4, index_q.shape[0], topk), dtype=torch.int32)


@torch.library.custom_op("flashmsa::index_decode", mutates_args=())
def index_decode(index_q: torch.Tensor, index_cache: torch.Tensor, seq_lens: torch.Tensor,
                 block_table: torch.Tensor, decode_query_len: int = 1, topk: int = 16,
                 topk_order: str = "ascending", index_dtype: str = "bf16") -> torch.Tensor:
    """Top-k block ids, int32 [4, B * decode_query_len, topk], for decode rows."""
    c = _config(topk, topk_order, index_dtype, "bf16")
    out = torch.empty((4, index_q.shape[0], topk), dtype=torch.int32, device=index_q.device)
    extra = _index_device_args(c, index_q, seq_lens, block_table)
    _C.index_decode(c, index_q, _index_cache(index_cache, index_dtype), seq_lens, block_table,
                    decode_query_len=decode_query_len, out=out, **extra)
    return out


@index_decode.register_fake
def _(index_q, index_cache, seq_lens, block_table, decode_query_len=1, topk=16,
      topk_order="ascending", index_dtype="bf16"):
    return index_q.new_empty((4, index_q.shape[0], topk), dtype=torch.int32)


@torch.library.custom_op("flashmsa::sparse_attention_prefill", mutates_args=("out", "lse"))
def sparse_attention_prefill(q: torch.Tensor, kv_cache: torch.Tensor,
                             kv_cache_v: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
                             seq_lens: torch.Tensor, block_table: torch.Tensor,
                             topk: torch.Tensor, out: torch.Tensor,
                             lse: Optional[torch.Tensor], kv_layout: str = "packed",
                             kv_dtype: str = "bf16", k_scale: float = 1.0,
                             v_scale: float = 1.0) -> None:
    """Sparse GQA attention of q [T, 64, 128] over each row's top-k blocks, into out [T, 64, 128]
    (and the natural-log log-sum-exp into lse [T, 64] fp32 when given)."""
    c = _config(topk.shape[2], "ascending", "bf16", kv_dtype)
    extra = _attention_device_args(c, q, seq_lens)
    _C.sparse_attention_prefill(c, q, _kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype,
                                                k_scale, v_scale),
                                cu_seqlens_q, seq_lens, block_table, topk, out, lse=lse, **extra)


@sparse_attention_prefill.register_fake
def _(q, kv_cache, kv_cache_v, cu_seqlens_q, seq_lens, block_table, topk, out, lse,
      kv_layout="packed", kv_dtype="bf16", k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("flashmsa::sparse_attention_decode",
                         mutates_args=("out", "lse", "mxfp8_scales"))
def sparse_attention_decode(q: torch.Tensor, kv_cache: torch.Tensor,
                            kv_cache_v: Optional[torch.Tensor], seq_lens: torch.Tensor,
                            block_table: torch.Tensor, topk: torch.Tensor, out: torch.Tensor,
                            lse: Optional[torch.Tensor], mxfp8_scales: Optional[torch.Tensor],
                            decode_query_len: int = 1, kv_layout: str = "packed",
                            kv_dtype: str = "bf16", k_scale: float = 1.0,
                            v_scale: float = 1.0, scale_layout: str = "row_major") -> None:
    """Decode attention of q [B * decode_query_len, 64, 128] into out [T, 64, 128]; with
    mxfp8_scales, out is uint8 [T, 64 * 128] E4M3 codes and mxfp8_scales the E8M0 scales
    (uint8 [T, 256] row-major, or the 128x4-swizzled buffer with scale_layout="swizzled"),
    bit-identical to quantizing the bf16 output. lse [T, 64] fp32 when given."""
    c = _config(topk.shape[2], "ascending", "bf16", kv_dtype)
    extra = _attention_device_args(c, q, seq_lens)
    _C.sparse_attention_decode(c, q, _kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype,
                                               k_scale, v_scale),
                               seq_lens, block_table, topk, out,
                               decode_query_len=decode_query_len, lse=lse,
                               mxfp8_scales=mxfp8_scales, scale_layout=scale_layout, **extra)


@sparse_attention_decode.register_fake
def _(q, kv_cache, kv_cache_v, seq_lens, block_table, topk, out, lse, mxfp8_scales,
      decode_query_len=1, kv_layout="packed", kv_dtype="bf16", k_scale=1.0, v_scale=1.0,
      scale_layout="row_major"):
    return None


@torch.library.custom_op("flashmsa::dense_attention", mutates_args=("out", "lse"))
def dense_attention(q: torch.Tensor, kv_cache: torch.Tensor, kv_cache_v: Optional[torch.Tensor],
                    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    out: torch.Tensor, lse: Optional[torch.Tensor], kv_layout: str = "packed",
                    kv_dtype: str = "bf16", k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Causal GQA attention of q [T, 64, 128] over every visible key of the paged cache, into
    out (and lse [T, 64] fp32 when given)."""
    c = _config(16, "ascending", "bf16", kv_dtype)
    extra = _attention_device_args(c, q, seq_lens)
    _C.dense_attention(c, q, _kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype, k_scale,
                                       v_scale),
                       cu_seqlens_q, seq_lens, block_table, out, lse=lse, **extra)


@dense_attention.register_fake
def _(q, kv_cache, kv_cache_v, cu_seqlens_q, seq_lens, block_table, out, lse, kv_layout="packed",
      kv_dtype="bf16", k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("flashmsa::insert_kv", mutates_args=("kv_cache", "kv_cache_v"))
def insert_kv(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
              kv_cache: torch.Tensor, kv_cache_v: Optional[torch.Tensor],
              kv_layout: str = "packed", kv_dtype: str = "bf16", k_scale: float = 1.0,
              v_scale: float = 1.0) -> None:
    """Write k, v [T, 4, 128] at slot_mapping [T] int64 (negative: skip) into the cache."""
    extra = _device_args(k)
    _C.insert_kv(_kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype, k_scale, v_scale), k, v,
                 slot_mapping, **extra)


@insert_kv.register_fake
def _(k, v, slot_mapping, kv_cache, kv_cache_v, kv_layout="packed", kv_dtype="bf16",
      k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("flashmsa::insert_index_k", mutates_args=("index_cache",))
def insert_index_k(index_k: torch.Tensor, slot_mapping: torch.Tensor, index_cache: torch.Tensor,
                   index_dtype: str = "bf16") -> None:
    """Write index_k [T, 128] at slot_mapping [T] int64 into the index cache."""
    extra = _device_args(index_k)
    _C.insert_index_k(_index_cache(index_cache, index_dtype), index_k, slot_mapping, **extra)


@insert_index_k.register_fake
def _(index_k, slot_mapping, index_cache, index_dtype="bf16"):
    return None


@torch.library.custom_op("flashmsa::produce_qkv_index",
                         mutates_args=("kv_cache", "kv_cache_v", "index_cache", "q", "index_q"))
def produce_qkv_index(qkv_index: torch.Tensor, q_norm_weight: torch.Tensor,
                      k_norm_weight: torch.Tensor, index_q_norm_weight: torch.Tensor,
                      index_k_norm_weight: torch.Tensor, positions: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_cache: torch.Tensor,
                      kv_cache_v: Optional[torch.Tensor], index_cache: torch.Tensor,
                      q: torch.Tensor, index_q: torch.Tensor, kv_layout: str = "packed",
                      kv_dtype: str = "bf16", index_dtype: str = "bf16", k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """The fused producer: qkv_index [T, 64*128 + 2*4*128 + 4*128 + 128] bf16 -> Gemma RMSNorm and
    partial NeoX RoPE -> q [T, 64, 128], index_q [T, 4, 128], k/v/index-k into the caches."""
    c = _config(16, "ascending", index_dtype, kv_dtype)
    extra = _device_args(qkv_index)
    _C.produce_qkv_index(c, qkv_index, q_norm_weight, k_norm_weight, index_q_norm_weight,
                         index_k_norm_weight, positions, slot_mapping,
                         _kv_cache(kv_cache, kv_cache_v, kv_layout, kv_dtype, k_scale, v_scale),
                         _index_cache(index_cache, index_dtype), q, index_q, **extra)


@produce_qkv_index.register_fake
def _(qkv_index, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight,
      positions, slot_mapping, kv_cache, kv_cache_v, index_cache, q, index_q, kv_layout="packed",
      kv_dtype="bf16", index_dtype="bf16", k_scale=1.0, v_scale=1.0):
    return None
