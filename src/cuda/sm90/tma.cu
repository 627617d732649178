// The tensor maps of tma.hpp, encoded by the driver's cuTensorMapEncodeTiled, reached through
// the runtime's entry-point query so that the library does not link libcuda itself.
#include "src/cuda/sm90/tma.hpp"

#include <cuda_runtime.h>

namespace flashmsa::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // the query's error is not the caller's
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

bool tma_stride(std::int64_t bytes) {
  return bytes > 0 && bytes % 16 == 0 && bytes < (std::int64_t{1} << 40);
}

}  // namespace

std::optional<CUtensorMap> page_plane_tensor_map(const CachePlane& plane, std::int64_t num_pages,
                                                 int num_heads, int row_elements, int elem_bytes,
                                                 int box_elements) {
  const EncodeTiled encode = encode_tiled();
  const bool heads = num_heads > 0;
  // A single head's stride is never stepped along: any valid one describes it.
  const std::int64_t head_stride = num_heads == 1 ? plane.page_stride : plane.head_stride;
  if (!encode || num_pages < 1 || num_heads < 0 ||
      reinterpret_cast<std::uintptr_t>(plane.data) % 16 != 0 || !tma_stride(plane.token_stride) ||
      !tma_stride(plane.page_stride) || (heads && !tma_stride(head_stride)) ||
      box_elements * elem_bytes != 128 || (elem_bytes != 1 && elem_bytes != 2)) {
    return std::nullopt;
  }
  // Dimensions innermost first: row elements, tokens, (heads,) pages.
  const cuuint32_t rank = heads ? 4 : 3;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(row_elements), 128,
                              static_cast<cuuint64_t>(heads ? num_heads : num_pages),
                              static_cast<cuuint64_t>(num_pages)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(plane.token_stride),
                                 static_cast<cuuint64_t>(heads ? head_stride : plane.page_stride),
                                 static_cast<cuuint64_t>(plane.page_stride)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_elements), 128, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r =
      encode(&map, elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
             rank, plane.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return std::nullopt;
  return map;
}

}  // namespace flashmsa::cuda
