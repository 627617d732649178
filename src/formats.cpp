#include "flashmsa/formats.hpp"

#include "flashmsa/error.hpp"

namespace flashmsa::fmt {

void mxfp8_quantize_rows(const std::uint16_t* bf16, std::int64_t rows, std::int64_t cols,
                         std::int64_t row_stride, std::uint8_t* codes, std::uint8_t* scales,
                         ScaleLayout layout, Mxfp8ScaleRule rule) {
  FLASHMSA_CHECK_ARG(rows >= 0, "rows must be >= 0, got ", rows);
  FLASHMSA_CHECK_ARG(cols > 0 && cols % kMxfp8GroupSize == 0,
                     "cols must be a positive multiple of 32 (the MXFP8 group), got ", cols);
  FLASHMSA_CHECK_ARG(row_stride >= cols, "row_stride must be >= cols (", cols, "), got ",
                     row_stride);
  FLASHMSA_CHECK_ARG(rows == 0 || (bf16 && codes && scales),
                     "bf16, codes and scales must be non-null");
  const std::int64_t scale_cols = cols / kMxfp8GroupSize;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < scale_cols; ++g) {
      scales[mxfp8_scale_offset(r, g, scale_cols, layout)] =
          mxfp8_quantize_group(bf16 + r * row_stride + g * kMxfp8GroupSize,
                               codes + r * cols + g * kMxfp8GroupSize, rule);
    }
  }
}

}  // namespace flashmsa::fmt
