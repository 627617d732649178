"""The bad-input suite (spec section 10): every op, the cache manager, the config, the cache views
and the batch metadata, fed one wrong thing at a time.

Each case is one class of bad input and asserts its outcome: an exception of the stated type whose
message names the argument and says what was expected and what was given, or, where the contract
defines an output for it (device values out of range, empty batches), exactly that output. The
summary line of the test run counts the classes (conftest.py).
"""

import re

import numpy as np
import pytest

import flashmsa

HQ, HKV, D, HIDX, DI, BLOCK = 64, 4, 128, 4, 128, 128
PAGES = 4


def bf16(shape, seed=0):
    """Random bf16 bits of N(0, 1) values."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def config(**fields):
    c = flashmsa.Config()
    for k, v in fields.items():
        setattr(c, k, v)
    return c


def kv_buf(pages=PAGES):
    return bf16((pages, HKV, BLOCK, 2 * D), 1)


def ix_buf(pages=PAGES):
    return bf16((pages, BLOCK, DI), 2)


def kv(pages=PAGES):
    return flashmsa.kv_cache("packed", "bf16", kv_buf(pages))


def ix(pages=PAGES):
    return flashmsa.index_cache_view("bf16", ix_buf(pages))


def i32(*v):
    """int32 array of the values, or of one nested list (a table)."""
    return np.asarray(v[0] if len(v) == 1 and isinstance(v[0], list) else v, dtype=np.int32)


def i64(*v):
    return np.asarray(v, dtype=np.int64)


def strided_zero(shape, dtype):
    """A writable array whose first dimension has stride 0 (every index aliases the first)."""
    base = np.zeros(shape[1:], dtype=dtype)
    return np.lib.stride_tricks.as_strided(base, shape, (0,) + base.strides, writeable=True)


# One prefill batch: a request of 200 tokens (2 blocks), its last 40 as query rows.
T = 40
CU, LENS, TABLE = i32(0, T), i32(200), i32([[0, 1, -1]])


def prefill(**kw):
    a = dict(config=flashmsa.Config(), index_q=bf16((T, HIDX, DI), 3), index_cache=ix(),
             cu_seqlens_q=CU, seq_lens=LENS, block_table=TABLE)
    a.update(kw)
    return flashmsa.index_prefill(**a)


def topk_ok():
    return prefill()


def attention(op=flashmsa.sparse_attention_prefill, **kw):
    a = dict(config=flashmsa.Config(), q=bf16((T, HQ, D), 4), kv_cache=kv(), cu_seqlens_q=CU,
             seq_lens=LENS, block_table=TABLE, topk=topk_ok(),
             out=np.zeros((T, HQ, D), np.uint16))
    if op is flashmsa.dense_attention:
        del a["topk"]
    a.update(kw)
    return op(**a)


def decode_index(**kw):
    a = dict(config=flashmsa.Config(), index_q=bf16((2, HIDX, DI), 5), index_cache=ix(),
             seq_lens=i32(200, 0), block_table=i32([[0, 1], [2, 3]]), decode_query_len=1)
    a.update(kw)
    return flashmsa.index_decode(**a)


def decode_attention(**kw):
    a = dict(config=flashmsa.Config(), q=bf16((2, HQ, D), 6), kv_cache=kv(),
             seq_lens=i32(200, 0), block_table=i32([[0, 1], [2, 3]]),
             topk=decode_index(), out=np.zeros((2, HQ, D), np.uint16), decode_query_len=1)
    a.update(kw)
    return flashmsa.sparse_attention_decode(**a)


WIDTH = HQ * D + 2 * HKV * D + HIDX * DI + DI


def produce(**kw):
    n = 3
    a = dict(config=flashmsa.Config(), qkv_index=bf16((n, WIDTH), 7),
             q_norm_weight=bf16((D,), 8), k_norm_weight=bf16((D,), 9),
             index_q_norm_weight=bf16((DI,), 10), index_k_norm_weight=bf16((DI,), 11),
             positions=i64(0, 1, 2), slot_mapping=i64(0, 1, 2), kv_cache=kv(), index_cache=ix(),
             q=np.zeros((n, HQ, D), np.uint16), index_q=np.zeros((n, HIDX, DI), np.uint16))
    a.update(kw)
    return flashmsa.produce_qkv_index(**a)


def insert(**kw):
    a = dict(cache=kv(), k=bf16((2, HKV, D), 12), v=bf16((2, HKV, D), 13),
             slot_mapping=i64(0, 5))
    a.update(kw)
    return flashmsa.insert_kv(**a)


def insert_index(**kw):
    a = dict(cache=ix(), index_k=bf16((2, DI), 14), slot_mapping=i64(0, 5))
    a.update(kw)
    return flashmsa.insert_index_k(**a)


def manager(**kw):
    a = dict(config=flashmsa.Config(), num_pages=4)
    a.update(kw)
    return flashmsa.CacheManager(**a)


def metadata(decode=(), dql=1, prefill_=((0, 5),), capacity=0):
    return flashmsa.build_batch_metadata(list(decode), dql, list(prefill_), capacity)


def check_config(**fields):
    config(**fields).check()


def cpu_reason(**fields):
    reason = config(**fields).unsupported_reason("cpu")
    if reason:
        raise RuntimeError(reason)


def cm_with_request():
    cm = manager()
    r = cm.add_request()
    cm.append(r, 130)
    return cm, r


# (class, call, exception, message pattern). Patterns name the argument and the expected and
# actual values, so a message that loses any of them fails the case.
def project(**over):
    """project_qkv_index on a small valid host problem (16 channels, hidden 32, 3 tokens), with
    `over` replacing arguments."""
    a = dict(weight=np.zeros((16, 32), np.uint8), scale=np.ones(16, np.float32),
             hidden=bf16((3, 32)), out=np.zeros((3, 16), np.uint16))
    a.update(over)
    return flashmsa.project_qkv_index(**a)


ERRORS = [
    # ---- Config: every field's rule ----
    ("config.sparse_num_index_heads=0", lambda: check_config(sparse_num_index_heads=0),
     ValueError, r"sparse_num_index_heads must be > 0, got 0"),
    ("config.sparse_num_index_heads not a multiple of kv heads",
     lambda: check_config(sparse_num_index_heads=6), ValueError,
     r"sparse_num_index_heads must be equal to or a multiple of num_key_value_heads \(4\), got 6"),
    ("config.sparse_index_dim=0", lambda: check_config(sparse_index_dim=0), ValueError,
     r"sparse_index_dim must be > 0, got 0"),
    ("config.sparse_index_dim odd", lambda: check_config(sparse_index_dim=127), ValueError,
     r"sparse_index_dim must be even, got 127"),
    ("config.sparse_block_size not a power of two", lambda: check_config(sparse_block_size=100),
     ValueError, r"sparse_block_size must be a power of two .*got 100"),
    ("config.sparse_block_size beyond int32", lambda: config(sparse_block_size=2**40),
     ValueError, r"sparse_block_size must be in \[-2147483648, 2\^31\), got 1099511627776"),
    ("config.sparse_topk_blocks=0", lambda: check_config(sparse_topk_blocks=0), ValueError,
     r"sparse_topk_blocks must be > 0, got 0"),
    ("config.sparse_topk_blocks beyond int32", lambda: config(sparse_topk_blocks=-2**33),
     ValueError, r"sparse_topk_blocks must be in .*got -8589934592"),
    ("config.sparse_topk_blocks over the CPU limit", lambda: cpu_reason(sparse_topk_blocks=100000),
     RuntimeError, r"cpu supports sparse_topk_blocks <= 1024, got 100000"),
    ("config.sparse_init_blocks negative", lambda: check_config(sparse_init_blocks=-1),
     ValueError, r"sparse_init_blocks must be >= 0, got -1"),
    ("config.sparse_local_blocks negative", lambda: check_config(sparse_local_blocks=-2),
     ValueError, r"sparse_local_blocks must be >= 0, got -2"),
    ("config init + local > topk",
     lambda: check_config(sparse_init_blocks=10, sparse_local_blocks=10), ValueError,
     r"sparse_init_blocks \+ sparse_local_blocks must be <= sparse_topk_blocks \(16\), got 20"),
    ("config.sparse_score_type", lambda: check_config(sparse_score_type="mean"), ValueError,
     r'sparse_score_type must be "max".*got "mean"'),
    ("config.sparse_disable_index_value", lambda: check_config(sparse_disable_index_value=False),
     ValueError, r"sparse_disable_index_value must be true"),
    ("config.indexer_kv_dtype", lambda: check_config(indexer_kv_dtype="int8"), ValueError,
     r'indexer_kv_dtype must be "bf16" or "fp8", got "int8"'),
    ("config.implementation", lambda: check_config(implementation="cutlass"), ValueError,
     r'implementation must be "triton" or "msa", got "cutlass"'),
    ("config fp8 indexer without msa", lambda: check_config(indexer_kv_dtype="fp8"), ValueError,
     r'implementation must be "msa" when indexer_kv_dtype is "fp8", got "triton"'),
    ("config msa with another block size",
     lambda: check_config(implementation="msa", sparse_block_size=64), ValueError,
     r'sparse_block_size must be 128 when implementation is "msa", got 64'),
    ("config fused projection without its requirements",
     lambda: check_config(fuse_qkv_index_projection=True), ValueError,
     r'"msa" when fuse_qkv_index_projection is true'),
    ("config.algorithm", lambda: check_config(algorithm="dsa"), ValueError,
     r'algorithm must be "minimax_m3", got "dsa"'),
    ("config.num_attention_heads=0", lambda: check_config(num_attention_heads=0), ValueError,
     r"num_attention_heads must be > 0, got 0"),
    ("config.num_key_value_heads=0", lambda: check_config(num_key_value_heads=0), ValueError,
     r"num_key_value_heads must be > 0, got 0"),
    ("config heads not a multiple", lambda: check_config(num_attention_heads=10), ValueError,
     r"num_attention_heads must be a multiple of num_key_value_heads \(4\), got 10"),
    ("config.num_key_value_heads beyond int32", lambda: config(num_key_value_heads=2**31),
     ValueError, r"num_key_value_heads must be in .*got 2147483648"),
    ("config.head_dim odd", lambda: check_config(head_dim=127), ValueError,
     r"head_dim must be even and > 0, got 127"),
    ("config.rope_dim odd", lambda: check_config(rope_dim=63), ValueError,
     r"rope_dim must be even, >= 0 and <= head_dim \(128\).*got 63"),
    ("config.rope_dim > head_dim", lambda: check_config(rope_dim=256), ValueError,
     r"rope_dim must be .*got 256"),
    ("config.kv_cache_dtype unknown", lambda: config(kv_cache_dtype="fp4"), ValueError,
     r"kv_cache_dtype: unknown dtype 'fp4'"),
    ("config.kv_cache_dtype not a cache dtype", lambda: check_config(kv_cache_dtype="fp32"),
     ValueError, r"kv_cache_dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, got fp32"),
    ("config.index_cache_dtype not an index dtype",
     lambda: check_config(index_cache_dtype="fp16"), ValueError,
     r"index_cache_dtype must be one of bf16, fp8_e4m3, nvfp4, got fp16"),
    ("config index dtype against the indexer",
     lambda: check_config(index_cache_dtype="fp8_e4m3", indexer_kv_dtype="bf16"), ValueError, r'index_cache_dtype must be bf16 or nvfp4 when indexer_kv_dtype is "bf16"'),
    ("config nvfp4 head_dim", lambda: check_config(kv_cache_dtype="nvfp4", head_dim=136),
     ValueError, r"head_dim must be a multiple of 16 for an nvfp4 kv cache, got 136"),
    ("config.softmax_scale negative", lambda: check_config(softmax_scale=-1.0), ValueError,
     r"softmax_scale must be finite and > 0, got -1"),
    ("config.softmax_scale NaN", lambda: check_config(softmax_scale=float("nan")), ValueError,
     r"softmax_scale must be finite and > 0, got nan"),
    ("config.rope_theta", lambda: check_config(rope_theta=0.0), ValueError,
     r"rope_theta must be finite and > 0, got 0"),
    ("config.rms_norm_eps", lambda: check_config(rms_norm_eps=float("inf")), ValueError,
     r"rms_norm_eps must be finite and > 0, got inf"),
    ("Config keyword that is no field", lambda: flashmsa.Config(sparse_topk=8), TypeError,
     r"Config has no field 'sparse_topk'; its fields are listed in Config.FIELDS"),
    ("config.topk_order name", lambda: config(topk_order="random"), ValueError,
     r"topk_order must be one of ascending, score_desc, local_last \(or a TopkOrder\), got "
     r"'random'"),
    ("config.for_tensor_parallel rank out of range",
     lambda: flashmsa.Config().for_tensor_parallel(8, 8), ValueError,
     r"rank must be in \[0, tp_size=8\), got 8"),
    ("config.for_tensor_parallel uneven q heads",
     lambda: flashmsa.Config().for_tensor_parallel(3, 0), ValueError,
     r"tp_size must divide num_attention_heads \(64\) so q heads split evenly, got tp_size 3"),
    ("config.unsupported_reason backend name", lambda: flashmsa.Config().unsupported_reason("tpu"),
     ValueError, r"backend must be 'cpu' or 'cuda_sm90', got 'tpu'"),

    # ---- Main cache views ----
    ("kv_cache layout", lambda: flashmsa.kv_cache("paged", "bf16", kv_buf()), ValueError,
     r"layout must be one of packed, separate, stacked, token_major, got 'paged'"),
    ("kv_cache dtype name", lambda: flashmsa.kv_cache("packed", "bf8", kv_buf()), ValueError,
     r"dtype: unknown dtype 'bf8'"),
    ("kv_cache dtype not a cache dtype", lambda: flashmsa.kv_cache("packed", "int32", kv_buf()),
     ValueError, r"kv_cache dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, got int32"),
    ("kv_cache flat byte array (segfault reproducer)",
     lambda: flashmsa.kv_cache("packed", "bf16", np.zeros(1000, np.uint8)), ValueError,
     r"k of a bf16 cache must have dtype bf16, got uint8"),
    ("kv_cache flat bf16 array", lambda: flashmsa.kv_cache("packed", "bf16",
                                                           np.zeros(1000, np.uint16)),
     ValueError, r"k must have shape \[pages, Hkv, page, 2\*E\] \(rank 4\), got rank 1"),
    ("kv_cache fp32 array as bf16",
     lambda: flashmsa.kv_cache("packed", "bf16", np.zeros((2, 4, 128, 256), np.float32)),
     ValueError, r"k of a bf16 cache must have dtype bf16, got fp32"),
    ("kv_cache float16 array as bf16",
     lambda: flashmsa.kv_cache("packed", "bf16", np.zeros((2, 4, 128, 256), np.float16)),
     ValueError, r"k of a bf16 cache must have dtype bf16, got fp16"),
    ("kv_cache strided last dimension",
     lambda: flashmsa.kv_cache("packed", "bf16", np.zeros((2, 4, 128, 512), np.uint16)[..., ::2]),
     ValueError, r"k must be contiguous in its last dimension, got stride 2"),
    ("kv_cache stride-0 pages",
     lambda: flashmsa.kv_cache("packed", "bf16", strided_zero((3, 4, 128, 256), np.uint16)),
     ValueError, r"kv_cache\.k\.page_stride \(0\) makes rows overlap"),
    ("kv_cache packed odd last dimension",
     lambda: flashmsa.kv_cache("packed", "bf16", np.zeros((2, 4, 128, 255), np.uint16)),
     ValueError, r"k \(packed\) must have an even last dimension \(K then V\), got 255"),
    ("kv_cache stacked without its K/V dimension",
     lambda: flashmsa.kv_cache("stacked", "bf16", np.zeros((2, 3, 4, 128, 128), np.uint16)),
     ValueError, r"k \(stacked\) must have 2 in dimension 1 \(K, V\), got 3"),
    ("kv_cache separate without v",
     lambda: flashmsa.kv_cache("separate", "bf16", np.zeros((2, 4, 128, 128), np.uint16)),
     ValueError, r"v is required for this layout and dtype"),
    ("kv_cache v of another shape",
     lambda: flashmsa.kv_cache("separate", "bf16", np.zeros((2, 4, 128, 128), np.uint16),
                               np.zeros((3, 4, 128, 128), np.uint16)),
     ValueError, r"v must be on cpu with k's shape up to its last dimension and 128 there"),
    ("kv_cache v for a packed layout",
     lambda: flashmsa.kv_cache("packed", "bf16", kv_buf(), kv_buf()), ValueError,
     r"v and v_scales must be None for the one-buffer layouts"),
    ("kv_cache nvfp4 without scales",
     lambda: flashmsa.kv_cache("packed", "nvfp4", np.zeros((2, 4, 128, 128), np.uint8)),
     ValueError, r"k_scales is required for this layout and dtype"),
    ("kv_cache nvfp4 scales of the wrong width",
     lambda: flashmsa.kv_cache("packed", "nvfp4", np.zeros((2, 4, 128, 128), np.uint8),
                               k_scales=np.zeros((2, 4, 128, 8), np.uint8)),
     ValueError, r"k_scales must be on cpu with k's shape up to its last dimension and 16 there"),
    ("kv_cache scales for a bf16 cache",
     lambda: flashmsa.kv_cache("packed", "bf16", kv_buf(),
                               k_scales=np.zeros((2, 4, 128, 16), np.uint8)),
     ValueError, r"k_scales / v_scales are only for nvfp4 caches, got them with bf16"),
    ("kv_cache num_kv_heads disagrees", lambda: flashmsa.kv_cache("packed", "bf16", kv_buf(),
                                                                  num_kv_heads=8),
     ValueError, r"num_kv_heads is 8 but k's shape holds 4 kv heads"),
    ("kv_cache head_dim disagrees", lambda: flashmsa.kv_cache("packed", "bf16", kv_buf(),
                                                              head_dim=64),
     ValueError, r"head_dim is 64 but k's shape holds head_dim 128"),
    ("kv_cache k_scale zero", lambda: flashmsa.kv_cache("packed", "fp8_e4m3",
                                                        np.zeros((2, 4, 128, 256), np.uint8),
                                                        k_scale=0.0),
     ValueError, r"kv_cache\.k_scale must be finite and > 0, got 0"),
    ("kv_cache v_scale NaN", lambda: flashmsa.kv_cache("packed", "fp8_e5m2",
                                                       np.zeros((2, 4, 128, 256), np.uint8),
                                                       v_scale=float("nan")),
     ValueError, r"kv_cache\.v_scale must be finite and > 0, got nan"),
    ("kv_cache read-only array", lambda: flashmsa.kv_cache("packed", "bf16",
                                                           np.broadcast_to(kv_buf(), (4, 4, 128,
                                                                                      256))),
     ValueError, r"k is written by this call and must be a writable array, got a read-only one"),
    ("kv_cache not an array", lambda: flashmsa.kv_cache("packed", "bf16", [1, 2, 3]), TypeError,
     r"k must be an array \(numpy, torch or any DLPack tensor\), got list"),
    ("kv_cache complex dtype", lambda: flashmsa.kv_cache("packed", "bf16",
                                                         np.zeros((2, 4, 128, 256), np.complex64)),
     ValueError, r"k: unsupported dtype"),

    # ---- Index cache views ----
    ("index_cache_view dtype name", lambda: flashmsa.index_cache_view("bf17", ix_buf()),
     ValueError, r"dtype: unknown dtype 'bf17'"),
    ("index_cache_view fp16", lambda: flashmsa.index_cache_view("fp16", ix_buf()), ValueError,
     r"index_cache dtype must be one of bf16, fp8_e4m3, nvfp4, got fp16"),
    ("index_cache_view rank 2", lambda: flashmsa.index_cache_view("bf16",
                                                                  np.zeros((4, 128), np.uint16)),
     ValueError, r"index_cache must have shape \[pages, page, E\] \(rank 3\), got rank 2"),
    ("index_cache_view fp32 data", lambda: flashmsa.index_cache_view(
        "bf16", np.zeros((4, 128, 128), np.float32)), ValueError,
     r"index_cache of a bf16 cache must have dtype bf16, got fp32"),
    ("index_cache_view nvfp4 without scales", lambda: flashmsa.index_cache_view(
        "nvfp4", np.zeros((4, 128, 64), np.uint8)), ValueError,
     r"index_cache scales is required for this layout and dtype"),
    ("index_cache_view nvfp4 scales of the wrong shape", lambda: flashmsa.index_cache_view(
        "nvfp4", np.zeros((4, 128, 64), np.uint8), np.zeros((4, 128, 4), np.uint8)), ValueError,
     r"index_cache scales must be on cpu with shape \[4, 128, 8\], got \[4, 128, 4\]"),
    ("index_cache_view scales for bf16", lambda: flashmsa.index_cache_view(
        "bf16", ix_buf(), np.zeros((4, 128, 8), np.uint8)), ValueError,
     r"index_cache scales are only for nvfp4, got them with bf16"),
    ("index_cache_view stride-0 pages", lambda: flashmsa.index_cache_view(
        "bf16", strided_zero((4, 128, 128), np.uint16)), ValueError,
     r"index_cache\.k\.page_stride \(0\) makes rows overlap"),

    # ---- Cache manager ----
    ("CacheManager num_pages=0", lambda: manager(num_pages=0), ValueError,
     r"num_pages must be in \[1, 2\^31\), got 0"),
    ("CacheManager num_pages beyond int32", lambda: manager(num_pages=2**40), ValueError,
     r"num_pages must be in \[1, 2\^31\), got 1099511627776"),
    ("CacheManager layout", lambda: manager(layout="paged"), ValueError,
     r"layout must be one of packed, separate, stacked, token_major, got 'paged'"),
    ("CacheManager device", lambda: manager(device="tpu"), ValueError,
     r"device must be 'cpu' or 'cuda', got 'tpu'"),
    ("CacheManager num_index_pages without separate pages", lambda: manager(num_index_pages=8),
     ValueError, r"num_index_pages must equal num_pages \(4\) when the index cache shares page "
                 r"ids, got 8"),
    ("CacheManager invalid config", lambda: manager(config=config(head_dim=3)), ValueError,
     r"head_dim must be even and > 0, got 3"),
    ("CacheManager append beyond its pages", lambda: cm_with_request()[0].append(
        cm_with_request()[1], 10**6), RuntimeError,
     r"out of cache pages: request 0 needs \d+ more, \d+ of 4 are free"),
    ("CacheManager unknown request", lambda: manager().append(7, 1), ValueError,
     r"request id 7 is not a live request"),
    ("CacheManager negative append", lambda: cm_with_request()[0].append(0, -1), ValueError,
     r"num_tokens must be >= 0, got -1"),
    ("CacheManager slot_mapping past the request",
     lambda: cm_with_request()[0].slot_mapping(0, 100, 100), ValueError, r"130"),
    ("CacheManager free of an unknown request", lambda: manager().free_request(3), ValueError,
     r"request id 3 is not a live request"),
    ("CacheManager block_table negative width", lambda: cm_with_request()[0].block_table([0], -1),
     ValueError, r"max_blocks must be >= 0, got -1"),

    # ---- Batch metadata ----
    ("metadata decode_query_len 0", lambda: metadata(decode=[(5, 0)], dql=0), ValueError,
     r"decode_query_len must be in \[1, 16\], got 0"),
    ("metadata decode_query_len 17", lambda: metadata(decode=[(5, 17)], dql=17), ValueError,
     r"decode_query_len must be in \[1, 16\], got 17"),
    ("metadata decode_query_len beyond int32", lambda: metadata(decode=[(5, 1)], dql=2**40),
     ValueError, r"decode_query_len must be in .*got 1099511627776"),
    ("metadata decode request of another length", lambda: metadata(decode=[(5, 2)], dql=1),
     ValueError, r"decode request 0: query_len must equal decode_query_len \(1\), got 2"),
    ("metadata decode_capacity below the decode requests",
     lambda: metadata(decode=[(5, 1), (6, 1)], capacity=1), ValueError,
     r"decode_capacity must be 0 or >= the 2 decode requests, got 1"),
    ("metadata prefix_len negative", lambda: metadata(prefill_=[(-1, 5)]), ValueError,
     r"prefill request 0: prefix_len must be >= 0, got -1"),
    ("metadata query_len 0", lambda: metadata(prefill_=[(0, 0)]), ValueError,
     r"prefill request 0: query_len must be >= 1, got 0"),
    ("metadata length beyond int32", lambda: metadata(prefill_=[(2**31 - 2, 5)]), ValueError,
     r"prefill request 0: prefix_len \+ query_len must fit int32, got 2147483651"),
    ("metadata 3 x 2^30 rows (fails before allocating)",
     lambda: metadata(prefill_=[(0, 2**30)] * 3), ValueError,
     r"the batch must have < 2\^31 token rows .*it has 1073741824 before a prefill request adds "
     r"1073741824"),
    ("metadata huge decode capacity", lambda: metadata(decode=[(5, 1)], capacity=2**40),
     ValueError, r"decode_capacity must keep the batch under 2\^31 token rows, got 1099511627776"),

    # ---- insert_kv / insert_index_k ----
    ("insert_kv k rank", lambda: insert(k=bf16((2, HKV * D))), ValueError,
     r"k must have shape \[\*, 4, 128\], got \[2, 512\]"),
    ("insert_kv k heads", lambda: insert(k=bf16((2, 2, D))), ValueError,
     r"k must have shape \[\*, 4, 128\], got \[2, 2, 128\]"),
    ("insert_kv k int dtype", lambda: insert(k=np.zeros((2, HKV, D), np.int32)), ValueError,
     r"k must have dtype bf16 or fp16 or fp32, got int32"),
    ("insert_kv v rows", lambda: insert(v=bf16((3, HKV, D))), ValueError,
     r"v must have shape \[2, 4, 128\], got \[3, 4, 128\]"),
    ("insert_kv slot_mapping int32", lambda: insert(slot_mapping=i32(0, 5)), ValueError,
     r"slot_mapping must have dtype int64, got int32"),
    ("insert_kv slot_mapping length", lambda: insert(slot_mapping=i64(0, 5, 6)), ValueError,
     r"slot_mapping must have shape \[2\], got \[3\]"),
    ("insert_kv checked slot beyond capacity (reproducer)",
     lambda: insert(slot_mapping=i64(0, 999 * 128), checked=True), ValueError,
     r"slot_mapping\[1\] = 127872 is beyond the cache capacity of 512 slots"),
    ("insert_kv v of an unsupported dtype",
     lambda: insert(v=np.zeros((2, HKV, D), np.complex64)), ValueError, r"v: unsupported dtype"),
    ("insert_kv negative stream", lambda: flashmsa.insert_kv(kv(), bf16((2, HKV, D)),
                                                             bf16((2, HKV, D)), i64(0, 1),
                                                             stream=-1), ValueError,
     r"stream must be a cudaStream_t as an integer \(0: the default stream\), got -1"),
    ("insert_index_k width", lambda: insert_index(index_k=bf16((2, 64))), ValueError,
     r"index_k must have shape \[\*, 128\], got \[2, 64\]"),
    ("insert_index_k slot dtype", lambda: insert_index(slot_mapping=i32(0, 1)), ValueError,
     r"slot_mapping must have dtype int64, got int32"),
    ("insert_index_k checked slot beyond capacity (reproducer)",
     lambda: insert_index(slot_mapping=i64(0, 999 * 128), checked=True), ValueError,
     r"slot_mapping\[1\] = 127872 is beyond the cache capacity of 512 slots"),

    # ---- index_prefill ----
    ("index_prefill index_q rank", lambda: prefill(index_q=bf16((T, HIDX * DI))), ValueError,
     r"index_q must have shape \[\*, 4, 128\], got \[40, 512\]"),
    ("index_prefill index_q heads", lambda: prefill(index_q=bf16((T, 2, DI))), ValueError,
     r"index_q must have shape \[\*, 4, 128\], got \[40, 2, 128\]"),
    ("index_prefill index_q fp32", lambda: prefill(index_q=np.zeros((T, HIDX, DI), np.float32)),
     ValueError, r"index_q must have dtype bf16 or fp16, got fp32"),
    ("index_prefill cu_seqlens length", lambda: prefill(cu_seqlens_q=i32(0, 20, T)), ValueError,
     r"batch\.cu_seqlens_q must have shape \[2\], got \[3\]"),
    ("index_prefill seq_lens int64", lambda: prefill(seq_lens=i64(200)), ValueError,
     r"batch\.seq_lens must have dtype int32, got int64"),
    ("index_prefill block_table rows", lambda: prefill(block_table=i32([[0, 1], [2, 3]])),
     ValueError, r"batch\.block_table must have shape \[1, \*\], got \[2, 2\]"),
    ("index_prefill block_table int64", lambda: prefill(block_table=np.zeros((1, 3), np.int64)),
     ValueError, r"batch\.block_table must have dtype int32, got int64"),
    ("index_prefill out shape", lambda: prefill(out=np.zeros((HKV, T, 15), np.int32)),
     ValueError, r"out must have shape \[4, 40, 16\], got \[4, 40, 15\]"),
    ("index_prefill out dtype", lambda: prefill(out=np.zeros((HKV, T, 16), np.int64)),
     ValueError, r"out must have dtype int32, got int64"),
    ("index_prefill out read-only", lambda: prefill(
        out=np.broadcast_to(np.zeros(16, np.int32), (HKV, T, 16))), ValueError,
     r"out is written by this call and must be a writable array, got a read-only one"),
    ("index_prefill out self-overlapping", lambda: prefill(
        out=strided_zero((HKV, T, 16), np.int32)), ValueError,
     r"out must not overlap itself \(it is written\), got stride 0 in dimension 0"),
    ("index_prefill out not an array", lambda: prefill(out="topk"), TypeError,
     r"out must be an array .*got str"),
    ("index_prefill block_scores dtype", lambda: prefill(
        block_scores=np.zeros((HKV, T, 3), np.float64)), ValueError,
     r"block_scores must have dtype fp32, got unsupported|block_scores: unsupported dtype"),
    ("index_prefill threads beyond int32", lambda: prefill(threads=2**40), ValueError,
     r"threads \(0: one per core\) must be in \[0, 2\^31\), got 1099511627776"),
    ("index_prefill threads negative", lambda: prefill(threads=-3), ValueError,
     r"threads \(0: one per core\) must be in \[0, 2\^31\), got -3"),
    ("index_prefill invalid config", lambda: prefill(config=config(sparse_topk_blocks=0)),
     ValueError, r"sparse_topk_blocks must be > 0, got 0"),
    ("index_prefill config the CPU cannot serve",
     lambda: prefill(config=config(sparse_topk_blocks=4096)), RuntimeError,
     r"cpu supports sparse_topk_blocks <= 1024, got 4096"),
    ("index_prefill index cache dtype against the config",
     lambda: prefill(index_cache=flashmsa.index_cache_view("nvfp4",
                                                           np.zeros((4, 128, 64), np.uint8),
                                                           np.zeros((4, 128, 8), np.uint8))),
     ValueError, r"index_cache\.dtype must be bf16 \(config\.index_cache_dtype\), got nvfp4"),
    ("index_prefill index cache page size against the config",
     lambda: prefill(index_cache=flashmsa.index_cache_view("bf16",
                                                           np.zeros((1000, 1, 128), np.uint16))),
     ValueError, r"index_cache must have index_dim 128 and page_size 128, got 128 and 1"),
    ("index_prefill checked cu_seqlens[0]", lambda: prefill(cu_seqlens_q=i32(1, T), checked=True),
     ValueError, r"batch\.cu_seqlens_q\[0\] must be 0, got 1"),
    ("index_prefill checked cu_seqlens[B]", lambda: prefill(cu_seqlens_q=i32(0, T - 1),
                                                            checked=True),
     ValueError, r"batch\.cu_seqlens_q\[B\] must equal the number of rows 40, got 39"),
    ("index_prefill host cu_seqlens[B] unchecked", lambda: prefill(cu_seqlens_q=i32(0, T - 1)),
     ValueError, r"batch\.cu_seqlens_q\[B\] must equal the number of rows 40, got 39"),
    ("sparse_attention_prefill host cu_seqlens[0] unchecked",
     lambda: attention(cu_seqlens_q=i32(1, T)),
     ValueError, r"batch\.cu_seqlens_q\[0\] must be 0, got 1"),
    ("index_prefill checked seq_lens below the rows", lambda: prefill(seq_lens=i32(10),
                                                                      checked=True),
     ValueError, r"request 0: seq_lens is smaller than its query rows"),
    ("index_prefill checked block-table hole", lambda: prefill(block_table=i32([[0, -1, -1]]),
                                                              checked=True),
     ValueError, r"batch\.block_table\[0\]\[1\] must be a page in \[0, 4\) for a visible block, "
                 r"got -1"),
    ("index_prefill checked page beyond the cache", lambda: prefill(block_table=i32([[0, 9, -1]]),
                                                                   checked=True),
     ValueError, r"batch\.block_table\[0\]\[1\] must be a page in \[0, 4\) for a visible block, "
                 r"got 9"),
    ("index_prefill checked seq_lens beyond the table", lambda: prefill(seq_lens=i32(10**7),
                                                                       checked=True),
     ValueError, r"batch\.seq_lens\[0\] reaches position 9999999, which needs 78125 blocks, but "
                 r"batch\.block_table has 3 columns"),

    # ---- index_decode ----
    ("index_decode decode_query_len 0", lambda: decode_index(decode_query_len=0), ValueError,
     r"batch\.decode_query_len must be in \[1, 16\], got 0"),
    ("index_decode decode_query_len 17", lambda: decode_index(
        index_q=bf16((34, HIDX, DI)), decode_query_len=17), ValueError,
     r"batch\.decode_query_len must be in \[1, 16\], got 17"),
    ("index_decode decode_query_len beyond int32", lambda: decode_index(decode_query_len=2**33),
     ValueError, r"decode_query_len must be in .*got 8589934592"),
    ("index_decode rows against B x dql", lambda: decode_index(index_q=bf16((3, HIDX, DI))),
     ValueError, r"decode rows must number batch size x decode_query_len \(2 x 1 = 2\), got 3"),
    ("index_decode seq_lens dtype", lambda: decode_index(seq_lens=i64(200, 0)), ValueError,
     r"batch\.seq_lens must have dtype int32, got int64"),
    ("index_decode checked block-table entry", lambda: decode_index(
        block_table=i32([[0, 77], [2, 3]]), checked=True), ValueError,
     r"batch\.block_table\[0\]\[1\] must be a page in \[0, 4\) for a visible block, got 77"),

    # ---- sparse_attention_prefill / dense_attention ----
    ("attention q heads", lambda: attention(q=bf16((T, 8, D))), ValueError,
     r"q must have shape \[\*, 64, 128\], got \[40, 8, 128\]"),
    ("attention q fp32", lambda: attention(q=np.zeros((T, HQ, D), np.float32)), ValueError,
     r"q must have dtype bf16 or fp16, got fp32"),
    ("attention out shape", lambda: attention(out=np.zeros((T, HQ, 64), np.uint16)), ValueError,
     r"out must have shape \[40, 64, 128\], got \[40, 64, 64\]"),
    ("attention out int dtype", lambda: attention(out=np.zeros((T, HQ, D), np.int32)),
     ValueError, r"out must have dtype bf16 or fp16 or fp32, got int32"),
    ("attention out fp8 in prefill", lambda: attention(out=np.zeros((T, HQ * D), np.uint8)),
     ValueError, r"out must have dtype bf16 or fp16 or fp32, got uint8"),
    ("attention out self-overlapping", lambda: attention(
        out=strided_zero((T, HQ, D), np.uint16)), ValueError,
     r"out must not overlap itself \(it is written\), got stride 0 in dimension 0"),
    ("attention out read-only", lambda: attention(
        out=np.broadcast_to(np.zeros(D, np.uint16), (T, HQ, D))), ValueError,
     r"out is written by this call and must be a writable array, got a read-only one"),
    ("attention lse shape", lambda: attention(lse=np.zeros((T, 4), np.float32)), ValueError,
     r"lse must have shape \[40, 64\], got \[40, 4\]"),
    ("attention lse fp16", lambda: attention(lse=np.zeros((T, HQ), np.float16)), ValueError,
     r"lse must have dtype fp32, got fp16"),
    ("attention topk dtype", lambda: attention(topk=np.zeros((HKV, T, 16), np.int64)),
     ValueError, r"topk must have dtype int32, got int64"),
    ("attention topk heads", lambda: attention(topk=np.zeros((2, T, 16), np.int32)), ValueError,
     r"topk must have shape \[4, 40, \*\], got \[2, 40, 16\]"),
    ("attention kv dtype against the config", lambda: attention(config=config(
        kv_cache_dtype="fp16")), ValueError,
     r"kv_cache\.dtype must be fp16 \(config\.kv_cache_dtype\), got bf16"),
    ("attention kv heads against the config", lambda: attention(kv_cache=flashmsa.kv_cache(
        "packed", "bf16", np.zeros((4, 2, 128, 256), np.uint16))), ValueError,
     r"kv_cache must have 4 kv heads, head_dim 128 and page_size 128, got 2, 128 and 128"),
    ("attention checked top-k id", lambda: attention(
        topk=np.full((HKV, T, 16), 7, np.int32), checked=True), ValueError,
     r"topk\[0\]\[0\]\[0\] = 7 is neither -1 nor a visible block \(< 2\)"),
    ("dense_attention q rows against the batch", lambda: attention(
        op=flashmsa.dense_attention, cu_seqlens_q=i32(0, T), q=bf16((T, HQ, D)),
        out=np.zeros((T + 1, HQ, D), np.uint16)), ValueError,
     r"out must have shape \[40, 64, 128\], got \[41, 64, 128\]"),

    # ---- sparse_attention_decode ----
    ("decode mxfp8 scales shape", lambda: decode_attention(
        out=np.zeros((2, HQ * D), np.uint8), mxfp8_scales=np.zeros((2, 7), np.uint8)),
     ValueError, r"mxfp8_scales must have shape \[2, 256\], got \[2, 7\]"),
    ("decode mxfp8 scale_layout", lambda: decode_attention(
        out=np.zeros((2, HQ * D), np.uint8), mxfp8_scales=np.zeros((2, 256), np.uint8),
        scale_layout="columns"), ValueError,
     r"scale_layout must be 'row_major' or 'swizzled', got 'columns'"),
    ("decode mxfp8 codes shape", lambda: decode_attention(
        out=np.zeros((2, HQ, D), np.uint8), mxfp8_scales=np.zeros((2, 256), np.uint8)),
     ValueError, r"out must have shape \[2, 8192\], got \[2, 64, 128\]"),
    ("decode rows against B x dql", lambda: decode_attention(
        q=bf16((2, HQ, D)), decode_query_len=2, topk=np.zeros((HKV, 2, 16), np.int32)),
     ValueError, r"decode rows must number batch size x decode_query_len \(2 x 2 = 4\), got 2"),
    ("decode workspace read-only", lambda: decode_attention(
        workspace=np.broadcast_to(np.zeros(1, np.uint8), (64,))), ValueError,
     r"workspace is written by this call and must be a writable array, got a read-only one"),

    # ---- produce_qkv_index ----
    ("produce qkv_index width", lambda: produce(qkv_index=bf16((3, WIDTH - 1))), ValueError,
     rf"qkv_index must have shape \[\*, {WIDTH}\], got \[3, {WIDTH - 1}\]"),
    ("produce norm weight length", lambda: produce(q_norm_weight=bf16((64,))), ValueError,
     r"q_norm_weight must have shape \[128\], got \[64\]"),
    ("produce positions fp32", lambda: produce(positions=np.zeros(3, np.float32)), ValueError,
     r"positions must have dtype int32 or int64, got fp32"),
    ("produce slot_mapping int32", lambda: produce(slot_mapping=i32(0, 1, 2)), ValueError,
     r"slot_mapping must have dtype int64, got int32"),
    ("produce q out shape", lambda: produce(q=np.zeros((3, HQ, 64), np.uint16)), ValueError,
     r"q must have shape \[3, 64, 128\], got \[3, 64, 64\]"),
    ("produce index_q out dtype", lambda: produce(index_q=np.zeros((3, HIDX, DI), np.float32)),
     ValueError, r"index_q must have dtype bf16 or fp16, got fp32"),
    ("produce checked negative position", lambda: produce(positions=i64(0, -5, 2), checked=True),
     ValueError, r"positions\[1\] = -5 is not a token position in \[0, 2\^31\)"),
    ("produce checked 2^62 position", lambda: produce(positions=i64(0, 1, 2**62), checked=True),
     ValueError, r"positions\[2\] = 4611686018427387904 is not a token position"),
    ("produce checked slot beyond capacity", lambda: produce(slot_mapping=i64(0, 1, 10**6),
                                                            checked=True),
     ValueError, r"slot_mapping\[2\] = 1000000 is beyond the cache capacity of 512 slots"),
    ("produce kv cache dtype against the config", lambda: produce(config=config(
        kv_cache_dtype="fp16")), ValueError,
     r"kv_cache\.dtype must be fp16 \(config\.kv_cache_dtype\), got bf16"),

    # ---- project_qkv_index ----
    ("project weight dtype", lambda: project(weight=np.zeros((16, 32), np.uint16)), ValueError,
     r"weights\.weight must have dtype fp8_e4m3, got bf16"),
    ("project scale length", lambda: project(scale=np.ones(15, np.float32)), ValueError,
     r"weights\.scale must have shape \[16\], got \[15\]"),
    ("project hidden width", lambda: project(hidden=bf16((3, 31))), ValueError,
     r"hidden must have shape \[\*, 32\], got \[3, 31\]"),
    ("project out rows", lambda: project(out=np.zeros((4, 16), np.uint16)), ValueError,
     r"out must have shape \[3, 16\], got \[4, 16\]"),
    ("project out read-only", lambda: project(out=np.broadcast_to(np.zeros(16, np.uint16),
                                                                (3, 16))), ValueError,
     r"out is written by this call and must be a writable array, got a read-only one"),
    ("projection workspace tokens", lambda: flashmsa.projection_workspace_bytes(-1, 6144),
     ValueError, r"max_tokens must be >= 0, got -1"),
]


@pytest.mark.parametrize("name,call,exc,pattern", ERRORS, ids=[c[0] for c in ERRORS])
def test_bad_input_is_refused_by_name(name, call, exc, pattern):
    with pytest.raises(exc) as info:
        call()
    assert re.search(pattern, str(info.value)), f"{name}: message was {info.value!s}"


# Classes where the contract defines an output instead of an error.
def empty_prefill_batch():
    """No rows, numpy's zero-stride empty arrays: valid, an empty result."""
    out = flashmsa.index_prefill(flashmsa.Config(), np.zeros((0, HIDX, DI), np.uint16), ix(),
                                 i32(0), np.zeros(0, np.int32), np.zeros((0, 3), np.int32))
    assert out.shape == (HKV, 0, 16)
    flashmsa.sparse_attention_prefill(flashmsa.Config(), np.zeros((0, HQ, D), np.uint16), kv(),
                                      i32(0), np.zeros(0, np.int32), np.zeros((0, 3), np.int32),
                                      out, np.zeros((0, HQ, D), np.uint16))


def empty_insert():
    buf = kv_buf()
    before = buf.copy()
    flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", buf), np.zeros((0, HKV, D), np.uint16),
                       np.zeros((0, HKV, D), np.uint16), np.zeros(0, np.int64))
    assert (buf == before).all()


def unchecked_slots_out_of_range_write_nothing():
    buf = kv_buf()
    before = buf.copy()
    flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", buf), bf16((3, HKV, D)),
                       bf16((3, HKV, D)), i64(-1, 999 * 128, 2**62))
    assert (buf == before).all()


def unchecked_index_slot_out_of_range_writes_nothing():
    buf = ix_buf()
    before = buf.copy()
    flashmsa.insert_index_k(flashmsa.index_cache_view("bf16", buf), bf16((2, DI)),
                            i64(PAGES * BLOCK, -7))
    assert (buf == before).all()


def long_seq_lens_bounded_by_the_table():
    """seq_lens 10^7 on a 3-block table: work bounded by the table, the local block is the last
    one the table holds (as the CUDA kernels clamp), no 5 GB scratch."""
    import time
    start = time.perf_counter()
    out = prefill(seq_lens=i32(10**7), cu_seqlens_q=i32(0, T))
    assert time.perf_counter() - start < 5
    assert (np.sort(out[:, 0, :3], axis=1) == [0, 1, 2]).all()
    assert (out[:, :, 3:] == -1).all()


def padding_decode_rows_select_nothing():
    out = decode_index()
    assert (out[:, 1, :] == -1).all()
    assert (np.sort(out[:, 0, :2], axis=1) == [0, 1]).all()


def garbage_topk_ids_are_skipped():
    ids = np.full((HKV, T, 16), -1, np.int32)
    ids[:, :, 0] = 2**31 - 1
    ids[:, :, 1] = -(2**31)
    ids[:, :, 2] = 57
    out = np.full((T, HQ, D), 0x7FC0, np.uint16)
    lse = np.zeros((T, HQ), np.float32)
    attention(topk=ids, out=out, lse=lse)
    assert (out == 0).all() and (lse == -np.inf).all()


def nan_query_row_is_nan():
    q = bf16((T, HQ, D), 4)
    q[5, 9, 0] = 0x7FC0
    out = np.zeros((T, HQ, D), np.uint16)
    lse = np.zeros((T, HQ), np.float32)
    attention(q=q, out=out, lse=lse)
    f = (out.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(f[5, 9]).all() and np.isnan(lse[5, 9])
    assert np.isfinite(np.delete(f.reshape(T * HQ, D), 5 * HQ + 9, axis=0)).all()


def read_only_inputs_are_accepted():
    q = bf16((T, HQ, D), 4)
    q.setflags(write=False)
    attention(q=q)


def strided_cache_array_is_used_through_its_strides():
    big = np.zeros((2 * PAGES, HKV, BLOCK, 2 * D), np.uint16)
    view = big[::2]
    k = bf16((1, HKV, D), 20)
    flashmsa.insert_kv(flashmsa.kv_cache("packed", "bf16", view), k, k, i64(3 * BLOCK + 5))
    assert (big[6, :, 5, :D] == k[0]).all() and (big[6, :, 5, D:] == k[0]).all()
    assert np.count_nonzero(big) == np.count_nonzero(k) * 2


DEFINED = [empty_prefill_batch, empty_insert, unchecked_slots_out_of_range_write_nothing,
           unchecked_index_slot_out_of_range_writes_nothing, long_seq_lens_bounded_by_the_table,
           padding_decode_rows_select_nothing, garbage_topk_ids_are_skipped,
           nan_query_row_is_nan, read_only_inputs_are_accepted,
           strided_cache_array_is_used_through_its_strides]


@pytest.mark.parametrize("case", DEFINED, ids=[f.__name__ for f in DEFINED])
def test_bad_input_with_a_defined_output(case):
    case()


BAD_INPUT_CLASSES = len(ERRORS) + len(DEFINED)
