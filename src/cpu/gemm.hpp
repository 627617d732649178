// fp32 matrix products of the CPU backend, row-major: OpenBLAS (one thread per call) when the
// build found it, else plain loops.
#pragma once

#include <cstdint>

namespace flashmsa::cpu {

// C[M, N] = alpha * A[M, K] * B[N, K]^T + beta * C
void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc);
// C[M, N] = alpha * A[M, K] * B[K, N] + beta * C
void gemm_nn(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
             std::int64_t ldc);

const char* gemm_library() noexcept;  // which implementation this build uses

}  // namespace flashmsa::cpu
