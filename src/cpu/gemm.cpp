#include "src/cpu/gemm.hpp"

#include <algorithm>

#if FLASHMSA_WITH_CBLAS
#include <cblas.h>

#include <mutex>
#endif

namespace flashmsa::cpu {

#if FLASHMSA_WITH_CBLAS

namespace {
// FlashMSA runs many products at once from its own workers; OpenBLAS's own threads would only
// oversubscribe the cores. Set once, before the first product (process-wide: OpenBLAS has no
// per-call setting).
void use_single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void sgemm(CBLAS_TRANSPOSE trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
  use_single_threaded_blas();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
}  // namespace

void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc) {
  sgemm(CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_nn(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc) {
  sgemm(CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* gemm_library() noexcept {
  return "OpenBLAS (one thread per call)";
}

#else

namespace {
void scale_c(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j)
      c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
  }
}
}  // namespace

void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc) {
  scale_c(m, n, beta, c, ldc);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (std::int64_t p = 0; p < k; ++p) sum += a[i * lda + p] * b[j * ldb + p];
      c[i * ldc + j] += alpha * sum;
    }
  }
}

void gemm_nn(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc) {
  scale_c(m, n, beta, c, ldc);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t p = 0; p < k; ++p) {
      const float ap = alpha * a[i * lda + p];
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] += ap * b[p * ldb + j];
    }
  }
}

const char* gemm_library() noexcept {
  return "built-in loops (no CBLAS found at build time)";
}

#endif

}  // namespace flashmsa::cpu
