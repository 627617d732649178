// Numeric formats (spec sections 6 and 7): the element conversions (formats/minifloat.hpp), the
// NVFP4 and MXFP8 block formats (formats/block_scaled.hpp), and host loops over whole tensors.
#pragma once

#include <cstdint>

#include "flashmsa/formats/block_scaled.hpp"
#include "flashmsa/formats/minifloat.hpp"

namespace flashmsa::fmt {

// Quantizes a bf16 matrix [rows, cols] (row stride `row_stride` elements, cols % 32 == 0) to
// MXFP8: E4M3 codes [rows, cols] (row stride `cols`) and E8M0 scales in `layout`, a buffer of
// mxfp8_scale_buffer_size(rows, cols / 32, layout) bytes. Only the scales of real rows and
// columns are written; swizzle padding is left as it was.
void mxfp8_quantize_rows(const std::uint16_t* bf16, std::int64_t rows, std::int64_t cols,
                         std::int64_t row_stride, std::uint8_t* codes, std::uint8_t* scales,
                         ScaleLayout layout, Mxfp8ScaleRule rule = Mxfp8ScaleRule::kRceil);

}  // namespace flashmsa::fmt
