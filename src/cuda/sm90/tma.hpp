// Host side of the TMA loads (wgmma.cuh's tma_load_3d): the tensor map that describes one head of
// a paged cache plane to the copy engine.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "flashmsa/cache.hpp"

namespace flashmsa::cuda {

// Head 0 of `plane` as a 3-D tensor of 1- or 2-byte elements (a row's `row_elements`, the 128
// tokens of a page, `num_pages` pages), read in boxes of `box_elements` x 128 tokens x 1 page
// written to shared memory with the 128-byte swizzle (box_elements x elem_bytes must be 128).
// nullopt where TMA cannot describe the plane (strides not multiples of 16 bytes or past 2^40, a
// driver without cuTensorMapEncodeTiled): the caller reports it.
std::optional<CUtensorMap> page_plane_tensor_map(const CachePlane& plane, std::int64_t num_pages,
                                                 int row_elements, int elem_bytes,
                                                 int box_elements);

}  // namespace flashmsa::cuda
