#include "memory/int8_rows.h"

#include <torch/torch.h>

#include <limits>

namespace attention {
namespace detail {

Int8Rows quantize_rows(const torch::Tensor& rows) {
  // In float (double rows in double, so that no row's largest element overflows float first).
  const auto wide = rows.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const torch::Tensor x = rows.detach().to(wide);
  const torch::Tensor largest = x.abs().amax(-1, /*keepdim=*/true);
  const torch::Tensor finite = torch::isfinite(largest);
  const torch::Tensor nan = torch::full_like(largest, std::numeric_limits<double>::quiet_NaN());
  // The scale as kept (float), and the codes that are nearest with it: 0 for rows of zeros and
  // rows that are not finite.
  const torch::Tensor scales = torch::where(finite, largest / 127.0, nan).to(torch::kFloat);
  // Divided, not multiplied by an inverse: the inverse of a subnormal scale is infinite.
  const torch::Tensor kept = scales.to(wide);
  const torch::Tensor codes =
      torch::where(kept > 0, torch::clamp(torch::round(x / kept), -127, 127), torch::zeros_like(x))
          .to(torch::kChar);
  return {codes.contiguous(), scales.squeeze(-1).contiguous()};
}

torch::Tensor dequantize_rows(const torch::Tensor& codes, const torch::Tensor& scales,
                              torch::Dtype dtype) {
  const auto wide = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  return (codes.to(wide) * scales.to(wide).unsqueeze(-1)).to(dtype);
}

}  // namespace detail
}  // namespace attention
