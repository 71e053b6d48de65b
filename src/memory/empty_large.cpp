#include "memory/empty_large.h"

#include "memory/large_buffer_cache.h"

#include <torch/torch.h>

namespace attention {
namespace detail {

torch::Tensor empty_large(c10::IntArrayRef sizes, const torch::TensorOptions& options) {
  size_t bytes = options.dtype().itemsize();
  for (auto size : sizes) bytes *= static_cast<size_t>(size);
  if (large_buffers_available() && options.device().is_cpu() && bytes >= 4 * kLargeBufferGranule) {
    const LargeBuffer buffer = acquire_large_buffer(bytes);
    if (buffer.data != nullptr) {
      return torch::from_blob(
          buffer.data, sizes, [buffer](void*) { give_back_large_buffer(buffer); }, options);
    }
  }
  return torch::empty(sizes, options);
}

}  // namespace detail
}  // namespace attention
