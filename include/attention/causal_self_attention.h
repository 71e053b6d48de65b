#pragma once

/// \file
/// SelfAttention that hides future tokens: the article's masking with -inf before the softmax.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of CausalSelfAttention.
struct CausalSelfAttentionOptions {
  CausalSelfAttentionOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v) {}
  TORCH_ARG(int64_t, d_in);
  TORCH_ARG(int64_t, d_out_kq);
  TORCH_ARG(int64_t, d_out_v);
  /// Dropout on the attention weights, applied in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
};

/// Causal (masked) self-attention: token t attends to tokens 0..t only.
///
/// Same parameters, names and initialization order as SelfAttention (`W_query`, `W_key`,
/// `W_value`, drawn with torch::rand). Input (T, d_in) or (B, T, d_in); output (..., T, d_out_v).
class CausalSelfAttentionImpl : public torch::nn::Cloneable<CausalSelfAttentionImpl> {
 public:
  CausalSelfAttentionImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : CausalSelfAttentionImpl(CausalSelfAttentionOptions(d_in, d_out_kq, d_out_v)) {}
  explicit CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// Throws as SelfAttention::forward does.
  torch::Tensor forward(const torch::Tensor& x);

  CausalSelfAttentionOptions options;
  torch::Tensor W_query;
  torch::Tensor W_key;
  torch::Tensor W_value;
};

TORCH_MODULE(CausalSelfAttention);

}  // namespace attention
