#pragma once

/// \file
/// SelfAttention that hides future tokens: the article's masking with -inf before the softmax.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of CausalSelfAttention.
struct CausalSelfAttentionOptions {
  /// The three sizes; dropout keeps its default.
  CausalSelfAttentionOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v) {}
  /// Size of each input token's feature vector.
  TORCH_ARG(int64_t, d_in);
  /// Size of queries and keys.
  TORCH_ARG(int64_t, d_out_kq);
  /// Size of values, and so of the output.
  TORCH_ARG(int64_t, d_out_v);
  /// Dropout on the attention weights, applied in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
};

/// Causal (masked) self-attention: token t attends to tokens 0..t only.
///
/// Same parameters, names and initialization order as SelfAttention (`W_query`, `W_key`,
/// `W_value`, drawn with torch::rand). Input (T, d_in) or (B, T, d_in); output (..., T, d_out_v).
///
/// Thread safety: forward() keeps nothing in the module (it only reads the parameters), so one
/// instance may serve several threads at once; eval(), train(), to(), reset() and load_weights()
/// need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// attention::CausalSelfAttention ca(/*d_in=*/3, /*d_out_kq=*/2, /*d_out_v=*/2);
/// torch::Tensor batch = torch::rand({2, 6, 3});
/// torch::Tensor context = ca(batch);  // (2, 6, 2); token t sees tokens 0..t
/// \endcode
class ATTENTION_API CausalSelfAttentionImpl : public torch::nn::Cloneable<CausalSelfAttentionImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  CausalSelfAttentionImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : CausalSelfAttentionImpl(CausalSelfAttentionOptions(d_in, d_out_kq, d_out_v)) {}
  /// Builds the module from options.
  explicit CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Throws as SelfAttention::forward does.
  torch::Tensor forward(const torch::Tensor& x);

  /// The options the module was built with.
  CausalSelfAttentionOptions options;
  /// Query projection, (d_in, d_out_kq).
  torch::Tensor W_query;
  /// Key projection, (d_in, d_out_kq).
  torch::Tensor W_key;
  /// Value projection, (d_in, d_out_v).
  torch::Tensor W_value;
};

TORCH_MODULE(CausalSelfAttention);

}  // namespace attention
