#pragma once

/// \file
/// Root-mean-square normalization over the last dimension (PyTorch's nn.RMSNorm, from 2.4).

#include <attention/export.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of RMSNorm.
struct RMSNormOptions {
  /// The size of the normalized (last) dimension.
  /* implicit */ RMSNormOptions(int64_t normalized_shape) : normalized_shape_(normalized_shape) {}
  /// The size of the normalized (last) dimension.
  TORCH_ARG(int64_t, normalized_shape);
  /// Added to the mean square before the root.
  TORCH_ARG(double, eps) = 1e-6;
};

/// y = x / sqrt(mean(x², last dim) + eps) * weight, with `weight` (normalized_shape) starting at
/// ones: PyTorch's nn.RMSNorm with one normalized dimension, its parameter named alike, for the
/// LibTorch generations that lack torch::nn::RMSNorm.
///
/// Thread safety: forward() keeps nothing in the module (it only reads the parameters), so one
/// instance may serve several threads at once; eval(), train(), to(), reset() and load_weights()
/// need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// attention::RMSNorm norm(attention::RMSNormOptions(64).eps(1e-6));
/// torch::Tensor y = norm(torch::randn({2, 10, 64}));  // every row of y has mean square ~1
/// \endcode
class ATTENTION_API RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl> {
 public:
  /// Builds the norm from its options.
  explicit RMSNormImpl(const RMSNormOptions& options_);
  /// (Re)creates `weight` as ones.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;
  /// Normalizes x's last dimension, which must have normalized_shape elements.
  torch::Tensor forward(const torch::Tensor& x);

  /// The options the module was built with.
  RMSNormOptions options;
  /// The scale of each feature, (normalized_shape).
  torch::Tensor weight;
};

TORCH_MODULE(RMSNorm);

}  // namespace attention
