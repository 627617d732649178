// Host side of the TMA loads (wgmma.cuh's tma_load_3d / tma_load_4d): the tensor map that
// describes a paged cache plane to the copy engine.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "flashmsa/cache.hpp"

namespace flashmsa::cuda {

// `plane` as a tensor of 1- or 2-byte elements (a row's `row_elements`, the 128 tokens of a page,
// then `num_heads` heads, then `num_pages` pages: a 4-D tensor; num_heads 0: head 0 only, a 3-D
// one), read in boxes of `box_elements` x 128 tokens (x 1 head) x 1 page written to shared memory
// with the 128-byte swizzle (box_elements x elem_bytes must be 128). nullopt where TMA cannot
// describe the plane (strides not multiples of 16 bytes or past 2^40, a driver without
// cuTensorMapEncodeTiled): the caller reports it, or takes another path.
std::optional<CUtensorMap> page_plane_tensor_map(const CachePlane& plane, std::int64_t num_pages,
                                                 int num_heads, int row_elements, int elem_bytes,
                                                 int box_elements);

}  // namespace flashmsa::cuda
