#pragma once

/// \file
/// fmt support for tensors, printed the way PyTorch prints them.
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// torch::Tensor t = torch::randn({6, 3});
/// fmt::print("{}\n", t);    // tensor([[ 0.3374, -0.1778, -0.1690], ...])
/// fmt::print("{:s}\n", t);  // torch.Size([6, 3])
/// std::string text = attention::format_tensor(t, /*precision=*/2);
/// \endcode

#include <ATen/core/Tensor.h>
#include <attention/export.h>
#include <fmt/format.h>

#include <string>

namespace attention {

/// The tensor as PyTorch's `print(t)` shows it (without grad_fn), `precision` decimals; an
/// undefined tensor as LibTorch prints it. Throws c10::ValueError for a precision outside
/// [0, 17], c10::TypeError for complex tensors, c10::Error for tensors without data (meta).
ATTENTION_API std::string format_tensor(const at::Tensor& tensor, int precision = 4);

/// The shape as PyTorch's `print(t.shape)` shows it: `torch.Size([6, 3])`. Throws
/// c10::ValueError for an undefined tensor, which has no shape. Thread safety: this function and
/// format_tensor() keep no state; any number of calls may run at once.
ATTENTION_API std::string format_shape(const at::Tensor& tensor);

}  // namespace attention

/// \cond
// `{}` prints the values, `{:s}` the shape.
template <>
struct fmt::formatter<at::Tensor> {
  bool shape = false;

  constexpr auto parse(format_parse_context& ctx) -> decltype(ctx.begin()) {
    auto it = ctx.begin();
    if (it != ctx.end() && *it == 's') {
      shape = true;
      ++it;
    }
    if (it != ctx.end() && *it != '}') throw format_error("invalid format for at::Tensor");
    return it;
  }

  template <typename FormatContext>
  auto format(const at::Tensor& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    const std::string text = shape ? attention::format_shape(t) : attention::format_tensor(t);
    return std::copy(text.begin(), text.end(), ctx.out());
  }
};
/// \endcond
