// The one device-side description of a cache plane (main K, V, their NVFP4 scales, index-K and
// its scales): the row of (page, head, token) starts at
// data + page * page_stride + head * head_stride + token * token_stride (bytes). Kernels that
// read a cache take DevicePlane, the ones that write it (insert, producer) WritablePlane; both
// come from the host view's CachePlane through device_plane().
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "flashmsa/cache.hpp"

namespace flashmsa::cuda {

template <class Byte>
struct DevicePlaneOf {
  Byte* data = nullptr;
  std::int64_t page_stride = 0, head_stride = 0, token_stride = 0;

#ifdef __CUDACC__
  __device__ Byte* row(std::int64_t page, std::int64_t head, std::int64_t token) const {
    return data + page * page_stride + head * head_stride + token * token_stride;
  }
#endif
};

using DevicePlane = DevicePlaneOf<const std::byte>;
using WritablePlane = DevicePlaneOf<std::byte>;

template <class Plane = DevicePlane>
Plane device_plane(const CachePlane& c) {
  using Byte = std::remove_pointer_t<decltype(Plane::data)>;
  return {static_cast<Byte*>(c.data), c.page_stride, c.head_stride, c.token_stride};
}

}  // namespace flashmsa::cuda
