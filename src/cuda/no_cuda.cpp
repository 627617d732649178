// The CUDA entry points of a build without CUDA.
#include "flashmsa/error.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/device_info.hpp"

namespace flashmsa::cuda {

bool compiled_with_cuda() noexcept {
  return false;
}
int visible_device_count() noexcept {
  return 0;
}
std::optional<std::string> sm90_device_unavailable_reason() {
  return "this FlashMSA build has no CUDA backend";
}

void* device_malloc(std::size_t) {
  throw Error(ErrorKind::kUnsupported, "device memory requested, but this build has no CUDA");
}
void device_free(void*) noexcept {}
void device_memset(void*, int, std::size_t) {
  throw Error(ErrorKind::kUnsupported, "device memory requested, but this build has no CUDA");
}

void copy_host_to_device(void*, const void*, std::size_t) {
  throw Error(ErrorKind::kUnsupported, "device memory requested, but this build has no CUDA");
}
void copy_device_to_host(void*, const void*, std::size_t) {
  throw Error(ErrorKind::kUnsupported, "device memory requested, but this build has no CUDA");
}
void device_synchronize() {}
std::string device_name() {
  return "no CUDA device";
}

std::vector<std::byte> copy_to_host(const TensorView&, void*) {
  throw Error(ErrorKind::kUnsupported, "device tensor, but this build has no CUDA");
}

void insert_kv(const KvCacheView&, const TensorView&, const TensorView&, const TensorView&, void*) {
  throw Error(ErrorKind::kUnsupported, "insert_kv: CUDA tensors, but this build has no CUDA");
}
void insert_index_k(const IndexCacheView&, const TensorView&, const TensorView&, void*) {
  throw Error(ErrorKind::kUnsupported, "insert_index_k: CUDA tensors, but this build has no CUDA");
}

void produce_qkv_index(const Config&, const ProducerInputs&, const KvCacheView&,
                       const IndexCacheView&, const ProducerOutputs&, void*) {
  throw Error(ErrorKind::kUnsupported,
              "produce_qkv_index: CUDA tensors, but this build has no CUDA");
}
void index_prefill(const Config&, const TensorView&, const IndexCacheView&, const PrefillBatch&,
                   const IndexOutputs&, void*) {
  throw Error(ErrorKind::kUnsupported, "index_prefill: CUDA tensors, but this build has no CUDA");
}
void index_decode(const Config&, const TensorView&, const IndexCacheView&, const DecodeBatch&,
                  const IndexOutputs&, void*) {
  throw Error(ErrorKind::kUnsupported, "index_decode: CUDA tensors, but this build has no CUDA");
}

void index_prefill_phases(const Config&, const TensorView&, const IndexCacheView&,
                          const PrefillBatch&, const IndexOutputs&, void*, bool) {
  throw Error(ErrorKind::kUnsupported, "index_prefill: CUDA tensors, but this build has no CUDA");
}
void index_decode_phases(const Config&, const TensorView&, const IndexCacheView&,
                         const DecodeBatch&, const IndexOutputs&, void*, bool) {
  throw Error(ErrorKind::kUnsupported, "index_decode: CUDA tensors, but this build has no CUDA");
}
void sparse_decode_step(const Config&, const TensorView&, const IndexCacheView&, const TensorView&,
                        const KvCacheView&, const DecodeBatch&, const IndexOutputs&,
                        const AttentionOutputs&, void*) {
  throw Error(ErrorKind::kUnsupported,
              "sparse_decode_step: CUDA tensors, but this build has no CUDA");
}
void sparse_attention_prefill(const Config&, const TensorView&, const KvCacheView&,
                              const PrefillBatch&, const TensorView&, const AttentionOutputs&,
                              void*) {
  throw Error(ErrorKind::kUnsupported,
              "sparse_attention_prefill: CUDA tensors, but this build has no CUDA");
}
void sparse_attention_decode(const Config&, const TensorView&, const KvCacheView&,
                             const DecodeBatch&, const TensorView&, const AttentionOutputs&,
                             void*) {
  throw Error(ErrorKind::kUnsupported,
              "sparse_attention_decode: CUDA tensors, but this build has no CUDA");
}
void dense_attention(const Config&, const TensorView&, const KvCacheView&, const PrefillBatch&,
                     const AttentionOutputs&, void*) {
  throw Error(ErrorKind::kUnsupported, "dense_attention: CUDA tensors, but this build has no CUDA");
}
void project_qkv_index(const ProjectionWeightView&, const TensorView&, const TensorView&,
                       const TensorView&, void*) {
  throw Error(ErrorKind::kUnsupported,
              "project_qkv_index: CUDA tensors, but this build has no CUDA");
}

}  // namespace flashmsa::cuda
