// The CUDA indexer's host entry for the decode step (src/cuda/sm90/attention/attention.cu's
// sparse_decode_step): scoring whose selection the attention kernel may make itself.
#pragma once

#include <optional>

#include "flashmsa/ops.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

enum class DecodeSelection {
  kHere,      // score, then the top-k kernel (index_decode)
  kNone,      // score only (the benchmark's scoring time)
  kDeferred,  // score; the caller's attention selects (AttentionDecode1SelectTraits) when one
              // scoring chunk holds every row, else the top-k kernel as kHere
};

// The decode indexer (index_decode's validation and launches). Returns the top-k parameters of a
// deferred selection (every row, its chunk the whole batch), or nullopt when none was deferred.
std::optional<IndexTopkParams> index_decode_run(const Config& config, const TensorView& index_q,
                                                const IndexCacheView& cache,
                                                const DecodeBatch& batch, const IndexOutputs& out,
                                                void* stream, DecodeSelection selection);

}  // namespace flashmsa::cuda
