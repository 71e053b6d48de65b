#include "operators/kernels.h"

#include <attention/rotary.h>

namespace attention {
namespace operators {

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta,
                           int64_t rotary_dim, c10::string_view layout) {
  namespace F = functional;
  F::RotaryLayout pairs = F::RotaryLayout::HalfSplit;
  if (layout == "interleaved") {
    pairs = F::RotaryLayout::Interleaved;
  } else {
    TORCH_CHECK_VALUE(layout == "half_split",
                      "attention::apply_rotary: expected layout 'half_split' or 'interleaved', "
                      "got '",
                      std::string(layout), "'");
  }
  return F::apply_rotary(x, positions,
                         F::RotaryOptions().theta(theta).rotary_dim(rotary_dim).layout(pairs));
}

}  // namespace operators
}  // namespace attention
