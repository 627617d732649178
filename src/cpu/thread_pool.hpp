// The CPU backend's workers: one pool for the process, sized to the machine, running
// parallel_for over independent tasks (requests, kv heads, query tiles). BLAS calls inside a task
// are single-threaded (src/cpu/gemm.cpp), so the two never oversubscribe.
#pragma once

#include <cstdint>
#include <functional>

namespace flashmsa::cpu {

// Runs task(i) for i in [0, n) on up to `max_threads` threads (0: all), the caller included.
// Returns when all are done; the first exception a task throws is rethrown here.
void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task,
                  int max_threads = 0);

int hardware_threads() noexcept;
// The threads parallel_for(..., max_threads) runs on (0: all).
int worker_threads(int max_threads) noexcept;

}  // namespace flashmsa::cpu
