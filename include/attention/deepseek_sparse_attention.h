#pragma once

/// \file
/// DeepSeek sparse attention (DeepSeek-V3.2): causal multi-head attention in which each query
/// attends only to the top k earlier tokens its lightning indexer picks.

#include <attention/export.h>
#include <attention/functional.h>
#include <attention/lightning_indexer.h>
#include <attention/sparse_attention.h>
#include <attention/sparse_attention_cache.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of DeepSeekSparseAttention; the indexer's sizes and topk start at the book's defaults.
struct DeepSeekSparseAttentionOptions {
  /// The three sizes of the attention.
  DeepSeekSparseAttentionOptions(int64_t d_in, int64_t d_out, int64_t num_heads)
      : d_in_(d_in), d_out_(d_out), num_heads_(num_heads) {}
  /// Feature size of the input x.
  TORCH_ARG(int64_t, d_in);
  /// Feature size of the output; a multiple of num_heads (head_dim = d_out / num_heads).
  TORCH_ARG(int64_t, d_out);
  /// Number of attention heads.
  TORCH_ARG(int64_t, num_heads);
  /// Bias in W_query, W_key and W_value (out_proj always has one, as in the book).
  TORCH_ARG(bool, qkv_bias) = false;
  /// Dropout on the attention weights, in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
  /// Number of index heads of the indexer.
  TORCH_ARG(int64_t, index_n_heads) = 4;
  /// Size of each index head (and of the index key each token keeps).
  TORCH_ARG(int64_t, index_head_dim) = 64;
  /// Keys each query attends to (fewer where fewer tokens came before it).
  TORCH_ARG(int64_t, topk) = 64;
  /// The kernel of the top-k attention (see functional::sparse_attention).
  TORCH_ARG(functional::Backend, backend) = functional::Backend::Auto;
};

/// DeepSeek sparse attention as in the bonus material of Raschka's book (chapter 4, `09_dsa`,
/// `MultiHeadAttentionWithDSA`): queries, keys and values per head as in MultiHeadAttention; the
/// `indexer` (a LightningIndexer on the same input) picks for each query the topk tokens among
/// itself and those before it, and the query attends to those only
/// (functional::sparse_attention): T x topk work per head where causal attention does T x T / 2,
/// and no T x T attention scores (the indexer's own scores are made a block of queries at a
/// time).
///
/// Parameters in the book's order, LibTorch's initialization (the same seed gives the book's
/// weights; its state dicts load by name): `W_query`, `W_key`, `W_value` (d_in -> d_out),
/// `out_proj` (d_out -> d_out), then `indexer.W_q_index`, `indexer.W_k_index`,
/// `indexer.W_weights`.
///
/// Input (B, T, d_in) or (T, d_in); output of the same rank with d_out features. With a
/// SparseAttentionCache the tokens follow the cached ones, whose keys, values and index keys the
/// cache keeps: the book's cache keeps the inputs themselves and projects every index key again
/// at each step.
///
/// Thread safety: forward() keeps nothing in the module (the indexer's score buffers belong to
/// the call), so one instance may serve several threads at once, each with its own
/// SparseAttentionCache; eval(), train(), to(), reset() and load_weights() need it to themselves.
///
/// Example:
/// \code
/// attention::DeepSeekSparseAttention dsa(
///     attention::DeepSeekSparseAttentionOptions(/*d_in=*/64, /*d_out=*/64, /*num_heads=*/4)
///         .index_head_dim(16)
///         .topk(8));
/// torch::Tensor x = torch::randn({2, 20, 64});
/// torch::Tensor y = dsa(x);  // (2, 20, 64): each token attends to at most 8 tokens
///
/// attention::SparseAttentionCache cache(/*max_length=*/20);
/// dsa(x.slice(1, 0, 19), &cache);
/// torch::Tensor last = dsa(x.slice(1, 19, 20), &cache);  // y's last token, within rounding
/// \endcode
class ATTENTION_API DeepSeekSparseAttentionImpl
    : public torch::nn::Cloneable<DeepSeekSparseAttentionImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  DeepSeekSparseAttentionImpl(int64_t d_in, int64_t d_out, int64_t num_heads)
      : DeepSeekSparseAttentionImpl(DeepSeekSparseAttentionOptions(d_in, d_out, num_heads)) {}
  /// Builds the module from options.
  explicit DeepSeekSparseAttentionImpl(const DeepSeekSparseAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Causal sparse attention of x's tokens, after the cache's when one is given (which they
  /// join). Throws c10::ValueError for a wrong shape and c10::TypeError for a wrong dtype of x,
  /// c10::Error for another device, and the cache's errors for tokens it refuses (before it
  /// changes).
  torch::Tensor forward(const torch::Tensor& x, SparseAttentionCache* cache = nullptr);

  /// Size of each head's queries, keys and values: d_out / num_heads.
  int64_t head_dim() const { return options.d_out() / options.num_heads(); }

  /// The options the module was built with.
  DeepSeekSparseAttentionOptions options;
  /// Query projection, d_in -> d_out.
  torch::nn::Linear W_query{nullptr};
  /// Key projection, d_in -> d_out.
  torch::nn::Linear W_key{nullptr};
  /// Value projection, d_in -> d_out.
  torch::nn::Linear W_value{nullptr};
  /// Output projection, d_out -> d_out.
  torch::nn::Linear out_proj{nullptr};
  /// The lightning indexer that picks each query's keys.
  LightningIndexer indexer{nullptr};
};

TORCH_MODULE(DeepSeekSparseAttention);

}  // namespace attention
