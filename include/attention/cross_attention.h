#pragma once

/// \file
/// Cross-attention: queries from one sequence, keys and values from another.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of CrossAttention.
struct CrossAttentionOptions {
  /// The three sizes; d_in_kv starts equal to d_in.
  CrossAttentionOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v), d_in_kv_(d_in) {}
  /// Feature size of x_1, the sequence the queries come from.
  TORCH_ARG(int64_t, d_in);
  /// Size of queries and keys.
  TORCH_ARG(int64_t, d_out_kq);
  /// Size of values, and so of the output.
  TORCH_ARG(int64_t, d_out_v);
  /// Feature size of x_2, the sequence keys and values come from (default: d_in).
  TORCH_ARG(int64_t, d_in_kv);
};

/// softmax(x_1 W_query (x_2 W_key)ᵀ / sqrt(d_out_kq)) x_2 W_value.
///
/// Parameters `W_query` (d_in, d_out_kq), `W_key` (d_in_kv, d_out_kq), `W_value`
/// (d_in_kv, d_out_v), drawn with torch::rand in that order. x_1 is (T_q, d_in) or
/// (B, T_q, d_in), x_2 (T_kv, d_in_kv) or (B, T_kv, d_in_kv) with the same rank and batch size;
/// the output is (..., T_q, d_out_v).
///
/// Thread safety: forward() keeps nothing in the module (it only reads the parameters), so one
/// instance may serve several threads at once; eval(), train(), to(), reset() and load_weights()
/// need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// attention::CrossAttention cross(/*d_in=*/3, /*d_out_kq=*/2, /*d_out_v=*/4);
/// torch::Tensor x_1 = torch::rand({6, 3});  // queries come from here
/// torch::Tensor x_2 = torch::rand({8, 3});  // keys and values from here
/// torch::Tensor context = cross(x_1, x_2);  // (6, 4)
/// \endcode
class ATTENTION_API CrossAttentionImpl : public torch::nn::Cloneable<CrossAttentionImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  CrossAttentionImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : CrossAttentionImpl(CrossAttentionOptions(d_in, d_out_kq, d_out_v)) {}
  /// Builds the module from options.
  explicit CrossAttentionImpl(const CrossAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Throws as SelfAttention::forward does, and c10::ValueError when the batch sizes of x_1 and
  /// x_2 differ.
  torch::Tensor forward(const torch::Tensor& x_1, const torch::Tensor& x_2);

  /// The options the module was built with.
  CrossAttentionOptions options;
  /// Query projection, (d_in, d_out_kq).
  torch::Tensor W_query;
  /// Key projection, (d_in_kv, d_out_kq).
  torch::Tensor W_key;
  /// Value projection, (d_in_kv, d_out_v).
  torch::Tensor W_value;
};

TORCH_MODULE(CrossAttention);

}  // namespace attention
