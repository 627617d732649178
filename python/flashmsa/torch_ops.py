"""FlashMSA operations as torch custom ops (``torch.ops.flashmsa.*``).

Registered when torch is importable (``import flashmsa`` does it), with fake implementations so
``torch.compile(fullgraph=True)`` traces through them. The caches are passed as the engine's own
tensors plus their layout, so nothing but tensors, ints, floats and strings crosses the op
boundary:

  kv_cache: the main cache tensor(s) in ``kv_layout`` ("packed": one [pages, Hkv, 128, 2E]
            tensor; "separate"/"token_major": pass ``kv_cache_v`` too; "stacked"), dtype
            ``kv_dtype`` (bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4). E is D elements, or D/2 bytes
            for nvfp4, whose per-16 E4M3 scales come in ``kv_scales`` (and ``kv_scales_v`` for the
            two-tensor layouts), same layout with E = D/16.
  index_cache: [pages, 128, Di] bf16 or fp8_e4m3, or nvfp4 uint8 [pages, 128, Di/2] with
            ``index_scales`` uint8 [pages, 128, Di/16].

Head counts and head dims come from the tensors, so a tensor-parallel rank's slice (e.g. 8 q
heads over 1 kv head) goes through unchanged: q heads and D from ``q``, kv heads from the cache,
index heads and Di from ``index_q``. The index ops return [Hkv, T, topk] with Hkv equal to the
index heads unless ``num_kv_heads`` says otherwise (MiniMax-M3 shards one index head per kv
head). Everything else is MiniMax-M3's configuration except the arguments given (top-k, order,
dtypes, scales).

Mutated tensors never have defaults: torch releases up to 2.11 drop a mutated argument left at its
default before bumping its version counter and fail with "tuple index out of range". So the
attention ops take their optional outputs (``lse``, and ``mxfp8_scales`` for decode), and the ops
that write a cache take its scale tensors, as required arguments, ``None`` for none.
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


def _config(topk: int = 16, topk_order: str = "ascending", index_dtype: str = "bf16",
            kv_dtype: str = "bf16", q: Optional[torch.Tensor] = None, kv=None,
            index_q: Optional[torch.Tensor] = None,
            num_kv_heads: Optional[int] = None) -> "_C.Config":
    """MiniMax-M3's configuration with the op's arguments and the shapes of its tensors: q
    [T, Hq, D], the KvCache view kv (Hkv, D, page size), index_q [T, Hidx, Di]."""
    c = _C.Config()
    c.sparse_topk_blocks = topk
    if topk_order not in _ORDERS:
        raise ValueError(f"topk_order must be one of {', '.join(_ORDERS)}, got {topk_order!r}")
    c.topk_order = _ORDERS[topk_order]
    c.set_index_cache_dtype(index_dtype)
    c.kv_cache_dtype = kv_dtype
    if kv is not None:
        c.num_key_value_heads = kv.num_kv_heads
        c.head_dim = kv.head_dim
        c.sparse_block_size = kv.page_size
    if q is not None:
        if q.dim() != 3:
            raise ValueError(f"q must be [T, Hq, D], got shape {tuple(q.shape)}")
        c.num_attention_heads = q.shape[1]
        c.head_dim = q.shape[2]
    if index_q is not None:
        if index_q.dim() != 3:
            raise ValueError(f"index_q must be [T, Hidx, Di], got shape {tuple(index_q.shape)}")
        c.sparse_num_index_heads = index_q.shape[1]
        c.sparse_index_dim = index_q.shape[2]
        c.num_key_value_heads = index_q.shape[1] if num_kv_heads is None else num_kv_heads
        if q is None:  # the index ops: any q head count the kv heads divide
            c.num_attention_heads = c.num_key_value_heads
    return c


def _topk_shape(index_q: torch.Tensor, topk: int, num_kv_heads: Optional[int]):
    heads = index_q.shape[1] if num_kv_heads is None else num_kv_heads
    return (heads, index_q.shape[0], topk)


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


def _index_setup(index_q, seq_lens, block_table, topk, topk_order, index_dtype, num_kv_heads):
    """What both index ops need first: their Config, the top-k output and the device args."""
    c = _config(topk, topk_order, index_dtype, index_q=index_q, num_kv_heads=num_kv_heads)
    out = torch.empty(_topk_shape(index_q, topk, num_kv_heads), dtype=torch.int32,
                      device=index_q.device)
    return c, out, _index_device_args(c, index_q, seq_lens, block_table)


def _attention_device_args(c, q, seq_lens) -> dict:
    return _device_args(q, lambda: _C.attention_workspace_bytes(c, q.shape[0], seq_lens.shape[0]))


def _index_cache(index_cache: torch.Tensor, index_dtype: str,
                 index_scales: Optional[torch.Tensor]):
    return _C.index_cache_view(index_dtype, index_cache, index_scales)


def _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
              v_scale):
    # Pages, heads and head dim come from the tensors' shapes.
    return _C.kv_cache(kv_layout, kv_dtype, kv_cache, kv_cache_v, k_scales=kv_scales,
                       v_scales=kv_scales_v, k_scale=k_scale, v_scale=v_scale)


@torch.library.custom_op("flashmsa::index_prefill", mutates_args=())
def index_prefill(index_q: torch.Tensor, index_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int = 16,
                  topk_order: str = "ascending", index_dtype: str = "bf16",
                  index_scales: Optional[torch.Tensor] = None,
                  num_kv_heads: Optional[int] = None) -> torch.Tensor:
    """Top-k block ids, int32 [Hkv, T, topk], for index_q [T, Hidx, Di] over a ragged batch."""
    c, out, extra = _index_setup(index_q, seq_lens, block_table, topk, topk_order, index_dtype,
                                 num_kv_heads)
    _C.index_prefill(c, index_q, _index_cache(index_cache, index_dtype, index_scales),
                     cu_seqlens_q, seq_lens, block_table, out=out, **extra)
    return out


@index_prefill.register_fake
def _(index_q, index_cache, cu_seqlens_q, seq_lens, block_table, topk=16,
      topk_order="ascending", index_dtype="bf16", index_scales=None, num_kv_heads=None):
    return index_q.new_empty(_topk_shape(index_q, topk, num_kv_heads), dtype=torch.int32)


@torch.library.custom_op("flashmsa::index_decode", mutates_args=())
def index_decode(index_q: torch.Tensor, index_cache: torch.Tensor, seq_lens: torch.Tensor,
                 block_table: torch.Tensor, decode_query_len: int = 1, topk: int = 16,
                 topk_order: str = "ascending", index_dtype: str = "bf16",
                 index_scales: Optional[torch.Tensor] = None,
                 num_kv_heads: Optional[int] = None) -> torch.Tensor:
    """Top-k block ids, int32 [Hkv, B * decode_query_len, topk], for decode rows."""
    c, out, extra = _index_setup(index_q, seq_lens, block_table, topk, topk_order, index_dtype,
                                 num_kv_heads)
    _C.index_decode(c, index_q, _index_cache(index_cache, index_dtype, index_scales), seq_lens,
                    block_table, decode_query_len=decode_query_len, out=out, **extra)
    return out


@index_decode.register_fake
def _(index_q, index_cache, seq_lens, block_table, decode_query_len=1, topk=16,
      topk_order="ascending", index_dtype="bf16", index_scales=None, num_kv_heads=None):
    return index_q.new_empty(_topk_shape(index_q, topk, num_kv_heads), dtype=torch.int32)


@torch.library.custom_op("flashmsa::sparse_attention_prefill", mutates_args=("out", "lse"))
def sparse_attention_prefill(q: torch.Tensor, kv_cache: torch.Tensor,
                             kv_cache_v: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
                             seq_lens: torch.Tensor, block_table: torch.Tensor,
                             topk: torch.Tensor, out: torch.Tensor,
                             lse: Optional[torch.Tensor], kv_layout: str = "packed",
                             kv_dtype: str = "bf16", k_scale: float = 1.0,
                             v_scale: float = 1.0, kv_scales: Optional[torch.Tensor] = None,
                             kv_scales_v: Optional[torch.Tensor] = None) -> None:
    """Sparse GQA attention of q [T, Hq, D] over each row's top-k blocks, into out [T, Hq, D]
    (and the natural-log log-sum-exp into lse [T, Hq] fp32 when given)."""
    kv = _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
                   v_scale)
    c = _config(topk.shape[2], kv_dtype=kv_dtype, q=q, kv=kv)
    extra = _attention_device_args(c, q, seq_lens)
    _C.sparse_attention_prefill(c, q, kv, cu_seqlens_q, seq_lens, block_table, topk, out, lse=lse,
                                **extra)


@sparse_attention_prefill.register_fake
def _(q, kv_cache, kv_cache_v, cu_seqlens_q, seq_lens, block_table, topk, out, lse,
      kv_layout="packed", kv_dtype="bf16", k_scale=1.0, v_scale=1.0, kv_scales=None,
      kv_scales_v=None):
    return None


@torch.library.custom_op("flashmsa::sparse_attention_decode",
                         mutates_args=("out", "lse", "mxfp8_scales"))
def sparse_attention_decode(q: torch.Tensor, kv_cache: torch.Tensor,
                            kv_cache_v: Optional[torch.Tensor], seq_lens: torch.Tensor,
                            block_table: torch.Tensor, topk: torch.Tensor, out: torch.Tensor,
                            lse: Optional[torch.Tensor], mxfp8_scales: Optional[torch.Tensor],
                            decode_query_len: int = 1, kv_layout: str = "packed",
                            kv_dtype: str = "bf16", k_scale: float = 1.0,
                            v_scale: float = 1.0, scale_layout: str = "row_major",
                            kv_scales: Optional[torch.Tensor] = None,
                            kv_scales_v: Optional[torch.Tensor] = None) -> None:
    """Decode attention of q [B * decode_query_len, Hq, D] into out [T, Hq, D]; with
    mxfp8_scales, out is uint8 [T, Hq * D] E4M3 codes and mxfp8_scales the E8M0 scales
    (uint8 [T, Hq * D / 32] row-major, or the 128x4-swizzled buffer with
    scale_layout="swizzled"), bit-identical to quantizing the bf16 output. lse [T, Hq] fp32 when
    given."""
    kv = _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
                   v_scale)
    c = _config(topk.shape[2], kv_dtype=kv_dtype, q=q, kv=kv)
    extra = _attention_device_args(c, q, seq_lens)
    _C.sparse_attention_decode(c, q, kv, seq_lens, block_table, topk, out,
                               decode_query_len=decode_query_len, lse=lse,
                               mxfp8_scales=mxfp8_scales, scale_layout=scale_layout, **extra)


@sparse_attention_decode.register_fake
def _(q, kv_cache, kv_cache_v, seq_lens, block_table, topk, out, lse, mxfp8_scales,
      decode_query_len=1, kv_layout="packed", kv_dtype="bf16", k_scale=1.0, v_scale=1.0,
      scale_layout="row_major", kv_scales=None, kv_scales_v=None):
    return None


@torch.library.custom_op("flashmsa::sparse_decode_step",
                         mutates_args=("out", "lse", "mxfp8_scales", "block_scores"))
def sparse_decode_step(index_q: torch.Tensor, index_cache: torch.Tensor, q: torch.Tensor,
                       kv_cache: torch.Tensor, kv_cache_v: Optional[torch.Tensor],
                       seq_lens: torch.Tensor, block_table: torch.Tensor, out: torch.Tensor,
                       lse: Optional[torch.Tensor], mxfp8_scales: Optional[torch.Tensor],
                       block_scores: Optional[torch.Tensor], decode_query_len: int = 1,
                       topk: int = 16, topk_order: str = "ascending", index_dtype: str = "bf16",
                       index_scales: Optional[torch.Tensor] = None, kv_layout: str = "packed",
                       kv_dtype: str = "bf16", k_scale: float = 1.0, v_scale: float = 1.0,
                       scale_layout: str = "row_major", kv_scales: Optional[torch.Tensor] = None,
                       kv_scales_v: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One sparse layer's decode step: index_decode then sparse_attention_decode in one call,
    with the same outputs bit for bit. Returns the top-k ids int32 [Hkv, T, topk]; out, lse and
    mxfp8_scales as sparse_attention_decode, block_scores fp32 [Hkv, T, max_blocks] when given."""
    kv = _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
                   v_scale)
    c = _config(topk, topk_order, index_dtype, kv_dtype, q=q, kv=kv, index_q=index_q)
    ids = torch.empty(_topk_shape(index_q, topk, None), dtype=torch.int32, device=index_q.device)
    extra = _device_args(q, lambda: _C.decode_workspace_bytes(
        c, seq_lens.shape[0], decode_query_len, block_table.shape[1]))
    _C.sparse_decode_step(c, index_q, _index_cache(index_cache, index_dtype, index_scales), q, kv,
                          seq_lens, block_table, out, decode_query_len=decode_query_len,
                          topk=ids, block_scores=block_scores, lse=lse,
                          mxfp8_scales=mxfp8_scales, scale_layout=scale_layout, **extra)
    return ids


@sparse_decode_step.register_fake
def _(index_q, index_cache, q, kv_cache, kv_cache_v, seq_lens, block_table, out, lse,
      mxfp8_scales, block_scores, decode_query_len=1, topk=16, topk_order="ascending",
      index_dtype="bf16", index_scales=None, kv_layout="packed", kv_dtype="bf16", k_scale=1.0,
      v_scale=1.0, scale_layout="row_major", kv_scales=None, kv_scales_v=None):
    return index_q.new_empty(_topk_shape(index_q, topk, None), dtype=torch.int32)


@torch.library.custom_op("flashmsa::dense_attention", mutates_args=("out", "lse"))
def dense_attention(q: torch.Tensor, kv_cache: torch.Tensor, kv_cache_v: Optional[torch.Tensor],
                    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    out: torch.Tensor, lse: Optional[torch.Tensor], kv_layout: str = "packed",
                    kv_dtype: str = "bf16", k_scale: float = 1.0, v_scale: float = 1.0,
                    kv_scales: Optional[torch.Tensor] = None,
                    kv_scales_v: Optional[torch.Tensor] = None) -> None:
    """Causal GQA attention of q [T, Hq, D] over every visible key of the paged cache, into
    out (and lse [T, Hq] fp32 when given)."""
    kv = _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
                   v_scale)
    c = _config(kv_dtype=kv_dtype, q=q, kv=kv)
    extra = _attention_device_args(c, q, seq_lens)
    _C.dense_attention(c, q, kv, cu_seqlens_q, seq_lens, block_table, out, lse=lse, **extra)


@dense_attention.register_fake
def _(q, kv_cache, kv_cache_v, cu_seqlens_q, seq_lens, block_table, out, lse, kv_layout="packed",
      kv_dtype="bf16", k_scale=1.0, v_scale=1.0, kv_scales=None, kv_scales_v=None):
    return None


@torch.library.custom_op("flashmsa::insert_kv",
                         mutates_args=("kv_cache", "kv_cache_v", "kv_scales", "kv_scales_v"))
def insert_kv(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
              kv_cache: torch.Tensor, kv_cache_v: Optional[torch.Tensor],
              kv_scales: Optional[torch.Tensor], kv_scales_v: Optional[torch.Tensor],
              kv_layout: str = "packed", kv_dtype: str = "bf16", k_scale: float = 1.0,
              v_scale: float = 1.0) -> None:
    """Write k, v [T, Hkv, D] at slot_mapping [T] int64 (negative: skip) into the cache (and, for
    nvfp4, its scales)."""
    extra = _device_args(k)
    _C.insert_kv(_kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype,
                           k_scale, v_scale), k, v, slot_mapping, **extra)


@insert_kv.register_fake
def _(k, v, slot_mapping, kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout="packed",
      kv_dtype="bf16", k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("flashmsa::insert_index_k", mutates_args=("index_cache", "index_scales"))
def insert_index_k(index_k: torch.Tensor, slot_mapping: torch.Tensor, index_cache: torch.Tensor,
                   index_scales: Optional[torch.Tensor], index_dtype: str = "bf16") -> None:
    """Write index_k [T, Di] at slot_mapping [T] int64 into the index cache (and, for nvfp4, its
    scales)."""
    extra = _device_args(index_k)
    _C.insert_index_k(_index_cache(index_cache, index_dtype, index_scales), index_k, slot_mapping,
                      **extra)


@insert_index_k.register_fake
def _(index_k, slot_mapping, index_cache, index_scales, index_dtype="bf16"):
    return None


@torch.library.custom_op("flashmsa::produce_qkv_index",
                         mutates_args=("kv_cache", "kv_cache_v", "kv_scales", "kv_scales_v",
                                       "index_cache", "index_scales", "q", "index_q"))
def produce_qkv_index(qkv_index: torch.Tensor, q_norm_weight: torch.Tensor,
                      k_norm_weight: torch.Tensor, index_q_norm_weight: torch.Tensor,
                      index_k_norm_weight: torch.Tensor, positions: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_cache: torch.Tensor,
                      kv_cache_v: Optional[torch.Tensor], kv_scales: Optional[torch.Tensor],
                      kv_scales_v: Optional[torch.Tensor], index_cache: torch.Tensor,
                      index_scales: Optional[torch.Tensor], q: torch.Tensor,
                      index_q: torch.Tensor, kv_layout: str = "packed", kv_dtype: str = "bf16",
                      index_dtype: str = "bf16", k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """The fused producer: qkv_index [T, Hq*D + 2*Hkv*D + Hidx*Di + Di] bf16 -> Gemma RMSNorm and
    partial NeoX RoPE -> q [T, Hq, D], index_q [T, Hidx, Di], k/v/index-k into the caches."""
    kv = _kv_cache(kv_cache, kv_cache_v, kv_scales, kv_scales_v, kv_layout, kv_dtype, k_scale,
                   v_scale)
    c = _config(index_dtype=index_dtype, kv_dtype=kv_dtype, q=q, kv=kv, index_q=index_q,
                num_kv_heads=kv.num_kv_heads)
    extra = _device_args(qkv_index)
    _C.produce_qkv_index(c, qkv_index, q_norm_weight, k_norm_weight, index_q_norm_weight,
                         index_k_norm_weight, positions, slot_mapping, kv,
                         _index_cache(index_cache, index_dtype, index_scales), q, index_q,
                         **extra)


@produce_qkv_index.register_fake
def _(qkv_index, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight,
      positions, slot_mapping, kv_cache, kv_cache_v, kv_scales, kv_scales_v, index_cache,
      index_scales, q, index_q, kv_layout="packed", kv_dtype="bf16", index_dtype="bf16",
      k_scale=1.0, v_scale=1.0):
    return None


@torch.library.custom_op("flashmsa::project_qkv_index", mutates_args=())
def project_qkv_index(hidden: torch.Tensor, weight: torch.Tensor,
                      scale: torch.Tensor) -> torch.Tensor:
    """The fused FP8 Q/K/V + index projection: hidden [T, hidden] bf16 -> [T, out_features] bf16
    (produce_qkv_index's qkv_index), with a packed weight (uint8 E4M3 codes [out_features,
    hidden] and float32 scale [out_features], from pack_qkv_index_projection, on the same
    device). CUDA: per-token E4M3 quantization + FP8 GEMM on the current stream."""
    out = torch.empty((hidden.shape[0], weight.shape[0]), dtype=torch.bfloat16,
                      device=hidden.device)
    extra = _device_args(hidden, lambda: _C.projection_workspace_bytes(hidden.shape[0],
                                                                       hidden.shape[1]))
    _C.project_qkv_index(weight, scale, hidden, out, **extra)
    return out


@project_qkv_index.register_fake
def _(hidden, weight, scale):
    return hidden.new_empty((hidden.shape[0], weight.shape[0]))
