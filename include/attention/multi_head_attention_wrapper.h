#pragma once

/// \file
/// The article's MultiHeadAttentionWrapper: several SelfAttention heads side by side.

#include <attention/export.h>
#include <attention/self_attention.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// The most heads MultiHeadAttentionWrapper builds: each head is a module of its own, so a count
/// beyond this is refused before the first is made instead of filling memory one module at a time.
constexpr int64_t kMaxWrapperHeads = 65536;

/// Options of MultiHeadAttentionWrapper.
struct MultiHeadAttentionWrapperOptions {
  /// The four sizes, as the article's constructor takes them.
  MultiHeadAttentionWrapperOptions(int64_t d_in, int64_t d_out_kq, int64_t d_out_v,
                                   int64_t num_heads)
      : d_in_(d_in), d_out_kq_(d_out_kq), d_out_v_(d_out_v), num_heads_(num_heads) {}
  /// Size of each input token's feature vector.
  TORCH_ARG(int64_t, d_in);
  /// Size of each head's queries and keys.
  TORCH_ARG(int64_t, d_out_kq);
  /// Value size of each head; the output has num_heads * d_out_v features.
  TORCH_ARG(int64_t, d_out_v);
  /// Number of heads: 1 to kMaxWrapperHeads.
  TORCH_ARG(int64_t, num_heads);
};

/// num_heads independent SelfAttention heads, their outputs concatenated on the last dimension.
///
/// The heads live in a ModuleList registered as `heads` (parameters `heads.0.W_query`, ...),
/// constructed in order, so a seed gives the same weights as the article's Python wrapper.
/// Input (T, d_in) or (B, T, d_in); output (..., T, num_heads * d_out_v).
///
/// Thread safety: forward() keeps nothing in the module (it only reads the parameters), so one
/// instance may serve several threads at once; eval(), train(), to(), reset() and load_weights()
/// need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// attention::MultiHeadAttentionWrapper wrapper(/*d_in=*/3, /*d_out_kq=*/2, /*d_out_v=*/1,
///                                              /*num_heads=*/4);
/// torch::Tensor context = wrapper(torch::rand({6, 3}));  // (6, 4): the heads side by side
/// \endcode
class ATTENTION_API MultiHeadAttentionWrapperImpl
    : public torch::nn::Cloneable<MultiHeadAttentionWrapperImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  MultiHeadAttentionWrapperImpl(int64_t d_in, int64_t d_out_kq, int64_t d_out_v, int64_t num_heads)
      : MultiHeadAttentionWrapperImpl(
            MultiHeadAttentionWrapperOptions(d_in, d_out_kq, d_out_v, num_heads)) {}
  /// Builds the module from options.
  explicit MultiHeadAttentionWrapperImpl(const MultiHeadAttentionWrapperOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Throws as SelfAttention::forward does.
  torch::Tensor forward(const torch::Tensor& x);

  /// The options the module was built with.
  MultiHeadAttentionWrapperOptions options;
  /// The SelfAttention heads, registered as `heads`.
  torch::nn::ModuleList heads;
};

TORCH_MODULE(MultiHeadAttentionWrapper);

}  // namespace attention
