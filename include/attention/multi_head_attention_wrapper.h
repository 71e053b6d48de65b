#pragma once

/// \file
/// The article's MultiHeadAttentionWrapper: several SelfAttention heads side by side.

#include <attention/self_attention.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of MultiHeadAttentionWrapper.
struct MultiHeadAttentionWrapperOptions {
  MultiHeadAttentionWrapperOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v,
                                   int64_t num_heads)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v), num_heads_(num_heads) {}
  TORCH_ARG(int64_t, d_in);
  TORCH_ARG(int64_t, d_out_kq);
  /// Value size of each head; the output has num_heads * d_out_v features.
  TORCH_ARG(int64_t, d_out_v);
  TORCH_ARG(int64_t, num_heads);
};

/// num_heads independent SelfAttention heads, their outputs concatenated on the last dimension.
///
/// The heads live in a ModuleList registered as `heads` (parameters `heads.0.W_query`, ...),
/// constructed in order, so a seed gives the same weights as the article's Python wrapper.
/// Input (T, d_in) or (B, T, d_in); output (..., T, num_heads * d_out_v).
class MultiHeadAttentionWrapperImpl : public torch::nn::Cloneable<MultiHeadAttentionWrapperImpl> {
 public:
  MultiHeadAttentionWrapperImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v, int64_t num_heads)
      : MultiHeadAttentionWrapperImpl(
            MultiHeadAttentionWrapperOptions(d_in, d_out_kq, d_out_v, num_heads)) {}
  explicit MultiHeadAttentionWrapperImpl(const MultiHeadAttentionWrapperOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// Throws as SelfAttention::forward does.
  torch::Tensor forward(const torch::Tensor& x);

  MultiHeadAttentionWrapperOptions options;
  torch::nn::ModuleList heads;
};

TORCH_MODULE(MultiHeadAttentionWrapper);

}  // namespace attention
