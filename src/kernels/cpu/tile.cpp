#include "kernels/cpu/tile.h"

#include "memory/empty_large.h"

#include <algorithm>

namespace attention {
namespace kernels {
namespace cpu {

Problem with_float_mask(const Problem& p) {
  Problem widened = p;
  if (p.mask.defined() && p.mask.is_floating_point()) widened.mask = p.mask.to(at::kFloat);
  return widened;
}

torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes) {
  return empty_in_layout_of(like, sizes, like.scalar_type());
}

torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes,
                                 at::ScalarType dtype) {
  std::vector<int64_t> order(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end() - 1,
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> permuted(like.dim()), inverse(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) {
    permuted[i] = sizes[order[i]];
    inverse[order[i]] = i;
  }
  return detail::empty_large(permuted, like.options().dtype(dtype)).permute(inverse);
}

torch::Tensor converted(const torch::Tensor& t, at::ScalarType dtype) {
  if (t.scalar_type() == dtype) return t;
  return empty_in_layout_of(t, t.sizes(), dtype).copy_(t);
}

std::vector<int64_t> matrix_offsets(const torch::Tensor& t) {
  const int64_t lead = t.dim() - 2;
  int64_t count = 1;
  for (int64_t i = 0; i < lead; ++i) count *= t.size(i);
  std::vector<int64_t> offsets(count);
  for (int64_t m = 0; m < count; ++m) {
    int64_t rest = m, offset = 0;
    for (int64_t i = lead - 1; i >= 0; --i) {
      offset += (rest % t.size(i)) * t.stride(i);
      rest /= t.size(i);
    }
    offsets[m] = offset;
  }
  return offsets;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
