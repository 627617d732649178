"""FlashMSA: MiniMax-M3 sparse attention (C++ core; see help(flashmsa))"""

from collections.abc import Sequence
import enum
from typing import Annotated

import numpy
from numpy.typing import NDArray


def version() -> str:
    """FlashMSA's version string."""

def build_info() -> str:
    """How this copy was built (CUDA, targets, compiler)."""

def backends() -> list[tuple[str, str]]:
    """[(backend, 'available' or the reason it is not)] for this machine."""

class TopkOrder(enum.Enum):
    ascending = 0

    score_desc = 1

    local_last = 2

class Config:
    """
    One MiniMax-M3 sparse attention layer's configuration (MiniMax-M3 defaults; TensorRT-LLM MiniMaxM3SparseAttentionConfig field names).
    """

    def __init__(self, **kwargs) -> None:
        """
        Config(**fields): MiniMax-M3's defaults with any field given by keyword, e.g. Config(kv_cache_dtype='fp8_e4m3', sparse_topk_blocks=32). index_cache_dtype also sets what it implies (see its property); a keyword beside it for those fields wins.
        """

    @property
    def algorithm(self) -> str: ...

    @algorithm.setter
    def algorithm(self, arg: str, /) -> None: ...

    @property
    def sparse_num_index_heads(self) -> int: ...

    @sparse_num_index_heads.setter
    def sparse_num_index_heads(self, arg: int, /) -> None: ...

    @property
    def sparse_index_dim(self) -> int: ...

    @sparse_index_dim.setter
    def sparse_index_dim(self, arg: int, /) -> None: ...

    @property
    def sparse_block_size(self) -> int: ...

    @sparse_block_size.setter
    def sparse_block_size(self, arg: int, /) -> None: ...

    @property
    def sparse_topk_blocks(self) -> int: ...

    @sparse_topk_blocks.setter
    def sparse_topk_blocks(self, arg: int, /) -> None: ...

    @property
    def sparse_init_blocks(self) -> int: ...

    @sparse_init_blocks.setter
    def sparse_init_blocks(self, arg: int, /) -> None: ...

    @property
    def sparse_local_blocks(self) -> int: ...

    @sparse_local_blocks.setter
    def sparse_local_blocks(self, arg: int, /) -> None: ...

    @property
    def sparse_score_type(self) -> str: ...

    @sparse_score_type.setter
    def sparse_score_type(self, arg: str, /) -> None: ...

    @property
    def sparse_disable_index_value(self) -> bool: ...

    @sparse_disable_index_value.setter
    def sparse_disable_index_value(self, arg: bool, /) -> None: ...

    @property
    def indexer_kv_dtype(self) -> str: ...

    @indexer_kv_dtype.setter
    def indexer_kv_dtype(self, arg: str, /) -> None: ...

    @property
    def fuse_qkv_index_projection(self) -> bool: ...

    @fuse_qkv_index_projection.setter
    def fuse_qkv_index_projection(self, arg: bool, /) -> None: ...

    @property
    def num_attention_heads(self) -> int | None: ...

    @num_attention_heads.setter
    def num_attention_heads(self, arg: int | None, /) -> None: ...

    @property
    def num_key_value_heads(self) -> int | None: ...

    @num_key_value_heads.setter
    def num_key_value_heads(self, arg: int | None, /) -> None: ...

    @property
    def implementation(self) -> str:
        """
        TensorRT-LLM's field, kept for parity of configs: 'triton' (its default) or 'msa' (which its fp8 indexer and fused projection require). FlashMSA runs its own kernels either way; the value only takes part in validation.
        """

    @implementation.setter
    def implementation(self, arg: str, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def kv_cache_dtype(self) -> str: ...

    @kv_cache_dtype.setter
    def kv_cache_dtype(self, arg: str, /) -> None: ...

    @property
    def index_cache_dtype(self) -> str:
        """
        bf16, fp8_e4m3 or nvfp4. Setting it also sets what it implies, as C++'s Config::set_index_cache_dtype does: fp8_e4m3 selects the fp8 indexer (indexer_kv_dtype 'fp8', implementation 'msa'), the others indexer_kv_dtype 'bf16'.
        """

    @index_cache_dtype.setter
    def index_cache_dtype(self, arg: str, /) -> None: ...

    def set_index_cache_dtype(self, dtype: str) -> None:
        """The same as assigning index_cache_dtype."""

    @property
    def softmax_scale(self) -> float | None: ...

    @softmax_scale.setter
    def softmax_scale(self, arg: float | None, /) -> None: ...

    @property
    def rope_dim(self) -> int: ...

    @rope_dim.setter
    def rope_dim(self, arg: int, /) -> None: ...

    @property
    def rope_theta(self) -> float: ...

    @rope_theta.setter
    def rope_theta(self, arg: float, /) -> None: ...

    @property
    def rms_norm_eps(self) -> float: ...

    @rms_norm_eps.setter
    def rms_norm_eps(self, arg: float, /) -> None: ...

    @property
    def topk_order(self) -> str: ...

    @topk_order.setter
    def topk_order(self, arg: object, /) -> None: ...

    def for_tensor_parallel(self, tp_size: int, rank: int) -> TensorParallelRank:
        """
        The layer as rank `rank` of `tp_size` serves it: q heads split evenly, kv and index heads split when Hkv >= tp_size and replicated otherwise, the index-K head on every rank. Returns a TensorParallelRank (config, first_q_head, first_kv_head, first_index_head); ValueError names an impossible split.
        """

    def __repr__(self) -> str: ...

    def __eq__(self, arg: Config, /) -> bool: ...

    def __ne__(self, arg: Config, /) -> bool: ...

    def __copy__(self) -> Config: ...

    def __deepcopy__(self, memo: object) -> Config: ...

    def __getstate__(self) -> tuple: ...

    def __setstate__(self, arg: tuple, /) -> None: ...

    def validate(self) -> list[str]:
        """
        Every problem of this config (empty when valid), each naming field, value and rule.
        """

    def check(self) -> None:
        """Raise ValueError listing every problem, if any."""

    def unsupported_reason(self, backend: str) -> str | None:
        """Why `backend` cannot serve this layer, or None."""

    FIELDS: tuple = ...

class TensorParallelRank:
    """What one tensor-parallel rank serves of a layer."""

    @property
    def config(self) -> Config: ...

    @property
    def first_q_head(self) -> int: ...

    @property
    def first_kv_head(self) -> int: ...

    @property
    def first_index_head(self) -> int: ...

    def __repr__(self) -> str: ...

class KvCache:
    """A view of a paged main K/V cache."""

    @property
    def dtype(self) -> str: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def k_scale(self) -> float: ...

    @k_scale.setter
    def k_scale(self, arg: float, /) -> None: ...

    @property
    def v_scale(self) -> float: ...

    @v_scale.setter
    def v_scale(self, arg: float, /) -> None: ...

    def __repr__(self) -> str: ...

class IndexCache:
    """A view of the index-K side cache."""

    @property
    def dtype(self) -> str: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def index_dim(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    def __repr__(self) -> str: ...

def kv_cache(layout: str, dtype: str, k: object, v: object | None = None, k_scales: object | None = None, v_scales: object | None = None, num_kv_heads: int | None = None, head_dim: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> KvCache:
    """
    A KvCache over caller-owned arrays (no copy; any strides with a contiguous last dimension). layout: packed [pages, Hkv, 128, 2*E], separate / token_major (k and v arrays [pages, Hkv, 128, E] / [pages, 128, Hkv, E]), stacked [pages, 2, Hkv, 128, E]; E = D elements for bf16/fp16 (uint16 bits on numpy) and fp8 (uint8 or fp8 dtypes), D/2 uint8 bytes for nvfp4, whose k_scales (and v_scales) have the same layout with E = D/16. Heads, head dim and pages come from the shapes (num_kv_heads / head_dim, if given, must agree). The arrays are kept alive by the view.
    """

def index_cache_view(dtype: str, data: object, scales: object | None = None) -> IndexCache:
    """
    An IndexCache over a caller-owned [pages, 128, Di] array (NVFP4: uint8 data [pages, 128, Di/2] and scales [pages, 128, Di/16]).
    """

class CacheManager:
    """
    Page pools for the main and index caches; requests, block tables, slot mappings.
    """

    def __init__(self, config: Config, num_pages: int, layout: str = 'packed', device: str = 'cpu', separate_index_pages: bool = False, num_index_pages: int = 0, shuffle_seed: int | None = None) -> None: ...

    def add_request(self) -> int: ...

    def append(self, request: int, num_tokens: int) -> int:
        """
        Grow a request by num_tokens; RuntimeError (nothing changed) when out of pages.
        """

    def free_request(self, arg: int, /) -> None: ...

    def length(self, arg: int, /) -> int: ...

    def free_pages(self) -> int: ...

    def pages(self, arg: int, /) -> list[int]: ...

    def block_table(self, requests: Sequence[int], max_blocks: int, index_cache: bool = False) -> NDArray[numpy.int32]:
        """
        int32 [len(requests), max_blocks]; -1 past each request's pages and for request -1.
        """

    def slot_mapping(self, request: int, first: int, count: int, index_cache: bool = False) -> NDArray[numpy.int64]:
        """int64 [count] slots of positions [first, first + count)."""

    @property
    def kv_cache(self) -> KvCache: ...

    @property
    def index_cache(self) -> IndexCache: ...

    def check_invariants(self) -> None: ...

    def __repr__(self) -> str: ...

def build_batch_metadata(decode: Sequence[tuple[int, int]], decode_query_len: int, prefill: Sequence[tuple[int, int]], decode_capacity: int = 0) -> dict:
    """
    Batch arrays from [(prefix_len, query_len)] lists: decode rows first (uniform query length 1..16), padding rows up to decode_capacity, then prefill rows.
    """

def insert_kv(cache: KvCache, k: Annotated[NDArray, dict(writable=False)], v: Annotated[NDArray, dict(writable=False)], slot_mapping: Annotated[NDArray, dict(writable=False)], checked: bool = False, stream: int = 0) -> None:
    """
    Write k, v [T, Hkv, D] (bf16/fp16/fp32) at slot_mapping [T] int64 (negative: skip), quantized to the cache dtype.
    """

def insert_index_k(cache: IndexCache, index_k: Annotated[NDArray, dict(writable=False)], slot_mapping: Annotated[NDArray, dict(writable=False)], checked: bool = False, stream: int = 0) -> None:
    """Write index_k [T, Di] at slot_mapping [T] int64."""

def index_prefill(config: Config, index_q: Annotated[NDArray, dict(writable=False)], index_cache: IndexCache, cu_seqlens_q: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], out: object | None = None, block_scores: object | None = None, checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> object:
    """
    Top-k block ids int32 [Hkv, T, topk] for index_q [T, Hidx, Di] over a ragged batch. CUDA tensors also need `out`, a uint8 `workspace` of index_workspace_bytes(...) bytes and the cudaStream_t to run on as an integer (`stream`, e.g. torch.cuda.current_stream().cuda_stream).
    """

def sparse_attention_prefill(config: Config, q: Annotated[NDArray, dict(writable=False)], kv_cache: KvCache, cu_seqlens_q: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)], out: object, lse: object | None = None, checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> None:
    """
    Sparse GQA attention of q [T, Hq, D] over each row's top-k blocks into out [T, Hq, D] (bf16 as uint16 on numpy, fp16, fp32) and optionally lse [T, Hq] fp32. CUDA tensors also need a uint8 `workspace` of attention_workspace_bytes(...) bytes and the stream.
    """

def dense_attention(config: Config, q: Annotated[NDArray, dict(writable=False)], kv_cache: KvCache, cu_seqlens_q: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], out: object, lse: object | None = None, checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> None:
    """
    Causal GQA attention over every visible key of the paged cache (the cross-check).
    """

def index_decode(config: Config, index_q: Annotated[NDArray, dict(writable=False)], index_cache: IndexCache, seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], decode_query_len: int = 1, out: object | None = None, checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> object:
    """
    Top-k block ids int32 [Hkv, B * decode_query_len, topk] for decode rows; rows of a request with seq_lens 0 (padding) select nothing. CUDA tensors: as index_prefill.
    """

def index_workspace_bytes(config: Config, num_rows: int, num_requests: int, max_blocks: int) -> int:
    """
    Bytes of the device workspace the CUDA indexer needs for such a batch (the CPU backend needs none).
    """

def attention_workspace_bytes(config: Config, num_rows: int, num_requests: int) -> int:
    """
    Bytes of the device workspace the CUDA attention needs for any prefill, dense or decode batch of at most num_requests requests and num_rows rows (the CPU backend needs none). The index ops' workspace can be the same buffer.
    """

def selects_every_block(config: Config, max_seq_len: int) -> bool:
    """
    Whether every row of a batch whose requests hold at most max_seq_len tokens each selects all of its visible blocks (full coverage): then dense_attention writes exactly the rows the indexer and the sparse attention would, and the indexer can be skipped.
    """

def decode_workspace_bytes(config: Config, max_requests: int, max_decode_query_len: int, max_blocks: int) -> int:
    """
    Bytes of one device workspace serving a whole decode step (index_decode then sparse_attention_decode) for every batch up to these capacities.
    """

def sparse_attention_decode(config: Config, q: Annotated[NDArray, dict(writable=False)], kv_cache: KvCache, seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)], out: object, decode_query_len: int = 1, lse: object | None = None, mxfp8_scales: object | None = None, scale_layout: str = 'row_major', checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> None:
    """
    Decode attention into out [T, Hq, D]; with mxfp8_scales, out is [T, Hq*D] E4M3 codes (uint8) and mxfp8_scales the E8M0 scales ([T, Hq*D/32] row-major, or the 128x4 swizzled buffer), bit-identical to quantizing the bf16 output.
    """

def sparse_decode_step(config: Config, index_q: Annotated[NDArray, dict(writable=False)], index_cache: IndexCache, q: Annotated[NDArray, dict(writable=False)], kv_cache: KvCache, seq_lens: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], out: object, decode_query_len: int = 1, topk: object | None = None, block_scores: object | None = None, lse: object | None = None, mxfp8_scales: object | None = None, scale_layout: str = 'row_major', checked: bool = False, threads: int = 0, workspace: object | None = None, stream: int = 0) -> object:
    """
    One sparse layer's decode step in one call: index_decode, then sparse_attention_decode over the top-k lists it writes, bit for bit the same outputs (on CUDA the attention selects each row's blocks itself where it can: no top-k launch). Returns the top-k ids int32 [Hkv, T, topk] (written into `topk` when given); out, lse and mxfp8_scales as sparse_attention_decode. CUDA tensors also need one uint8 `workspace` of decode_workspace_bytes(...) bytes and the stream.
    """

def produce_qkv_index(config: Config, qkv_index: Annotated[NDArray, dict(writable=False)], q_norm_weight: Annotated[NDArray, dict(writable=False)], k_norm_weight: Annotated[NDArray, dict(writable=False)], index_q_norm_weight: Annotated[NDArray, dict(writable=False)], index_k_norm_weight: Annotated[NDArray, dict(writable=False)], positions: Annotated[NDArray, dict(writable=False)], slot_mapping: Annotated[NDArray, dict(writable=False)], kv_cache: KvCache, index_cache: IndexCache, q: object, index_q: object, index_slot_mapping: Annotated[NDArray, dict(writable=False)] | None = None, checked: bool = False, threads: int = 0, stream: int = 0) -> None:
    """
    The fused producer: qkv_index [T, Hq*D + 2*Hkv*D + Hidx*Di + Di] -> Gemma RMSNorm and partial NeoX RoPE -> q [T, Hq, D], index_q [T, Hidx, Di], k/v/index-k into the caches.
    """

PROJECTION_LAYOUT_VERSION: int = 1

def pack_qkv_index_projection(config: Config, tp_size: int, rank: int, q: Annotated[NDArray, dict(writable=False)], k: Annotated[NDArray, dict(writable=False)], v: Annotated[NDArray, dict(writable=False)], index_q: Annotated[NDArray, dict(writable=False)], index_k: Annotated[NDArray, dict(writable=False)]) -> tuple[object, object]:
    """
    Packs one tensor-parallel rank's fused projection weight (layout version PROJECTION_LAYOUT_VERSION) from the layer's bf16 weights (uint16 bits or bfloat16, [out, hidden] each, all heads): returns (weight uint8 [out_features, hidden] E4M3 codes, scale float32 [out_features]), the output channels in the producer's row order [q | k | v | index_q | index_k] of that rank.
    """

def projection_source(config: Config, tp_size: int, rank: int, n: int) -> tuple[str, int]:
    """
    Where output channel n of a rank's fused projection comes from: (weight name, row).
    """

def project_qkv_index_cpu(weight: Annotated[NDArray, dict(writable=False)], scale: Annotated[NDArray, dict(writable=False)], hidden: Annotated[NDArray, dict(writable=False)], out: object | None = None, version: int = 1) -> object:
    """
    The fused projection on the CPU (the oracle of a GPU path): hidden [T, hidden] bf16 -> per-token E4M3 (scale max|x|/448) -> fp32 products with the packed weight -> bf16 [T, out_features] (uint16 bits when out is left out).
    """

def projection_workspace_bytes(max_tokens: int, hidden: int) -> int:
    """
    Bytes of device workspace project_qkv_index needs for up to max_tokens tokens (CUDA).
    """

def project_qkv_index(weight: Annotated[NDArray, dict(writable=False)], scale: Annotated[NDArray, dict(writable=False)], hidden: Annotated[NDArray, dict(writable=False)], out: object, workspace: object | None = None, stream: int = 0) -> None:
    """
    The fused projection on the arrays' device: hidden [T, hidden] bf16 -> out [T, out_features] bf16 (the producer's qkv_index), with the packed weight (E4M3 codes as uint8 or fp8, [out_features, hidden]) and its float32 scale. CUDA: per-token E4M3 quantization + FP8 GEMM on `stream`, with a uint8 workspace of projection_workspace_bytes(T, hidden) bytes; graph-capturable.
    """
