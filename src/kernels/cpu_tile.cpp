#include "kernels/cpu_tile.h"

namespace attention {
namespace kernels {
namespace cpu {

Problem with_float_mask(const Problem& p) {
  Problem widened = p;
  if (p.mask.defined() && p.mask.is_floating_point()) widened.mask = p.mask.to(at::kFloat);
  return widened;
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
