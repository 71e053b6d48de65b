#pragma once

// Sizes that may be symbolic. Under torch.compile with dynamic shapes (LibTorch 2), the Meta and
// Autograd kernels see tensors whose sizes are symbols: they read them as SymInts, and a
// comparison guards the traced graph on its outcome. LibTorch 1.13 has concrete sizes only.

#include <torch/torch.h>

#include <vector>

namespace attention {
namespace operators {

#if TORCH_VERSION_MAJOR >= 2
using Size = c10::SymInt;

inline std::vector<Size> sizes_of(const torch::Tensor& t) {
  const auto sizes = t.sym_sizes();
  return {sizes.begin(), sizes.end()};
}

inline Size size_of(const torch::Tensor& t, int64_t dim) {
  return t.sym_size(dim);
}

inline torch::Tensor empty_of(const std::vector<Size>& sizes, const torch::TensorOptions& options) {
  return at::empty_symint(sizes, options);
}

inline bool has_elements(const torch::Tensor& t) {
  return t.sym_numel() != 0;
}
#else
using Size = int64_t;

inline std::vector<Size> sizes_of(const torch::Tensor& t) {
  return t.sizes().vec();
}

inline Size size_of(const torch::Tensor& t, int64_t dim) {
  return t.size(dim);
}

inline torch::Tensor empty_of(const std::vector<Size>& sizes, const torch::TensorOptions& options) {
  return torch::empty(sizes, options);
}

inline bool has_elements(const torch::Tensor& t) {
  return t.numel() != 0;
}
#endif

}  // namespace operators
}  // namespace attention
