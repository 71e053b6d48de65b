#pragma once

/// \file
/// The normalizations of today's attention layers, as one module: RMSNorm (Llama, Qwen3, OLMo 3,
/// Gemma 4), RMSNorm with zero-centred weights (Gemma 3, Qwen3.5) and LayerNorm without a bias
/// (Cohere, Tiny Aya), each with the parameter name its model's checkpoints use.

#include <attention/export.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// How Norm normalizes the last dimension of x, with weight w.
enum class NormKind {
  /// x / sqrt(mean(x²) + eps) * w, w starting at ones: PyTorch's nn.RMSNorm (Llama), Qwen3's and
  /// OLMo 3's RMSNorm, Gemma 4's.
  RMS,
  /// x / sqrt(mean(x²) + eps) * (1 + w), w starting at zeros: Gemma 3's and Qwen3.5's RMSNorm,
  /// whose checkpoints store the weight zero-centred.
  ZeroCenteredRMS,
  /// (x - mean(x)) / sqrt(var(x) + eps) * w (the biased variance), w starting at ones, no bias:
  /// Cohere's LayerNorm (Tiny Aya).
  LayerNorm,
};

/// The name a Norm registers its weight under, so that a state dict loads by name.
enum class NormParameter {
  /// `weight`: PyTorch's nn.RMSNorm and nn.LayerNorm, Hugging Face's checkpoints, the book's
  /// OLMo 3, Qwen3.5, Tiny Aya and Gemma 4 classes.
  Weight,
  /// `scale`: the book's Qwen3 and Gemma 3 classes (and its chapter-4 LayerNorm).
  Scale,
};

/// What a HeadNormOptions normalization of MultiHeadAttention spans.
enum class HeadNormScope {
  /// Each head's features (head_dim), after the projection is split into heads: Qwen3's, Gemma
  /// 3's, Qwen3.5's and Gemma 4's QK-norm.
  PerHead,
  /// The whole projection (num_heads x head_dim for the queries, num_kv_heads x head_dim for the
  /// keys and values), before it is split: OLMo 3's QK-norm.
  Projection,
};

/// A normalization of MultiHeadAttention's queries and keys (`qk_norm`) or values
/// (`value_norm`): a Norm per projection, its size decided by the scope.
struct HeadNormOptions {
  /// The normalization.
  TORCH_ARG(NormKind, kind) = NormKind::RMS;
  /// What one normalization spans.
  TORCH_ARG(HeadNormScope, scope) = HeadNormScope::PerHead;
  /// Added to the mean square (the variance) before the root: finite and >= 0.
  TORCH_ARG(double, eps) = 1e-6;
  /// A learned weight (default true); Gemma 4's value norm has none.
  TORCH_ARG(bool, elementwise_affine) = true;
  /// The weight's name in the norm.
  TORCH_ARG(NormParameter, parameter_name) = NormParameter::Weight;
};

/// Options of Norm.
struct NormOptions {
  /// The size of the normalized (last) dimension.
  /* implicit */ NormOptions(int64_t normalized_shape) : normalized_shape_(normalized_shape) {}
  /// The size of the normalized (last) dimension.
  TORCH_ARG(int64_t, normalized_shape);
  /// The normalization.
  TORCH_ARG(NormKind, kind) = NormKind::RMS;
  /// Added to the mean square (the variance) before the root: finite and >= 0.
  TORCH_ARG(double, eps) = 1e-6;
  /// A learned weight (default true); without one the norm has no parameter (Gemma 4's norm of
  /// the values).
  TORCH_ARG(bool, elementwise_affine) = true;
  /// The weight's name.
  TORCH_ARG(NormParameter, parameter_name) = NormParameter::Weight;
};

/// A normalization over the last dimension (NormKind), computed in float for bfloat16 and half
/// inputs and rounded once, as the book's classes compute theirs in float32; float32 and float64
/// in their own dtype (the book's classes would round a float64 input to float32 first). The
/// weight has the module's dtype: a module cast to bfloat16 rounds it, where the book's classes
/// keep their norm weights in float32 (a relative difference of at most 2^-9 in each weight).
///
/// Thread safety: forward() keeps nothing in the module, so one instance may serve several
/// threads at once; eval(), train(), to(), reset() and load_weights() need the module to
/// themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// // Gemma 3's query norm: zero-centred weights named `scale`, over a head of 256 features.
/// attention::Norm q_norm(attention::NormOptions(256)
///                            .kind(attention::NormKind::ZeroCenteredRMS)
///                            .parameter_name(attention::NormParameter::Scale));
/// torch::Tensor y = q_norm(torch::randn({1, 4, 10, 256}));
/// \endcode
class ATTENTION_API NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  /// Builds the norm from its options; throws c10::ValueError for a normalized_shape below 1 or
  /// a negative or non-finite eps.
  explicit NormImpl(const NormOptions& options_);
  /// (Re)creates the weight: ones, or zeros for ZeroCenteredRMS.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;
  /// Normalizes x's last dimension, which must have normalized_shape elements; x of the weight's
  /// dtype (any floating dtype without a weight). Throws c10::ValueError or c10::TypeError naming
  /// the module otherwise.
  torch::Tensor forward(const torch::Tensor& x);

  /// The options the module was built with.
  NormOptions options;
  /// The weight (normalized_shape), registered as `weight` or `scale` (options.parameter_name());
  /// undefined without elementwise_affine.
  torch::Tensor weight;
};

TORCH_MODULE(Norm);

}  // namespace attention
