// The formats a cache page can reach the tensor cores in, and the bytes one plane of a page
// occupies in a raw shared-memory stage (host and device: launchers size shared memory with it).
#pragma once

namespace flashmsa::cuda {

// How a cache page reaches the tensor cores.
enum class KvFormat {
  kNative16,  // bf16 / fp16 cache: copied straight into the swizzled MMA tiles
  kE4m3,
  kE5m2,
  kNvfp4,  // the three others: raw bytes, then widened exactly to the MMA type
};

// Bytes of one plane of a page (128 tokens x 128 dims; or a warp's kTokens of them) in a raw
// stage: element rows, then (NVFP4) the rows' E4M3 block scales.
template <KvFormat kFormat, int kTokens = 128>
constexpr int raw_plane_bytes() {
  return kTokens * (kFormat == KvFormat::kNative16 ? 256
                    : kFormat == KvFormat::kNvfp4  ? 64 + 8
                                                   : 128);
}

}  // namespace flashmsa::cuda
