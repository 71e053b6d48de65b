#pragma once

/// \file
/// The article's SelfAttention: one head of scaled dot-product attention.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of SelfAttention.
struct SelfAttentionOptions {
  /// The three sizes, as the article's constructor takes them.
  SelfAttentionOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v) {}
  /// Size of each input token's feature vector.
  TORCH_ARG(int64_t, d_in);
  /// Size of queries and keys.
  TORCH_ARG(int64_t, d_out_kq);
  /// Size of values, and so of the output.
  TORCH_ARG(int64_t, d_out_v);
};

/// softmax(x W_query (x W_key)ᵀ / sqrt(d_out_kq)) x W_value.
///
/// Parameters `W_query` (d_in, d_out_kq), `W_key` (d_in, d_out_kq), `W_value` (d_in, d_out_v),
/// drawn with torch::rand in that order, as the article's Python class does: after
/// `torch::manual_seed(123)`, `SelfAttention(3, 2, 4)` holds the article's weights.
///
/// Input (T, d_in) or (B, T, d_in); output (T, d_out_v) or (B, T, d_out_v).
///
/// Thread safety: forward() keeps nothing in the module (it only reads the parameters), so one
/// instance may serve several threads at once; eval(), train(), to(), reset() and load_weights()
/// need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// attention::SelfAttention sa(/*d_in=*/3, /*d_out_kq=*/2, /*d_out_v=*/4);
/// torch::Tensor x = torch::rand({6, 3});  // six tokens, three features each
/// torch::Tensor context = sa(x);          // (6, 4)
/// \endcode
class ATTENTION_API SelfAttentionImpl : public torch::nn::Cloneable<SelfAttentionImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  SelfAttentionImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v)
      : SelfAttentionImpl(SelfAttentionOptions(d_in, d_out_kq, d_out_v)) {}
  /// Builds the module from options.
  explicit SelfAttentionImpl(const SelfAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Throws c10::ValueError for a wrong rank or feature size, c10::TypeError for a dtype other
  /// than the parameters', c10::Error for another device.
  torch::Tensor forward(const torch::Tensor& x);

  /// The options the module was built with.
  SelfAttentionOptions options;
  /// Query projection, (d_in, d_out_kq).
  torch::Tensor W_query;
  /// Key projection, (d_in, d_out_kq).
  torch::Tensor W_key;
  /// Value projection, (d_in, d_out_v).
  torch::Tensor W_value;
};

TORCH_MODULE(SelfAttention);

}  // namespace attention
