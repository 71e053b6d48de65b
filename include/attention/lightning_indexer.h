#pragma once

/// \file
/// DeepSeek's lightning indexer: a few small heads that score every earlier token for each query
/// and pick the top k, which DeepSeek sparse attention then attends to.

#include <attention/export.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of LightningIndexer; the head count and size start at the book's defaults.
struct LightningIndexerOptions {
  /// The input's feature size.
  /* implicit */ LightningIndexerOptions(int64_t d_model) : d_model_(d_model) {}
  /// The input's feature size.
  TORCH_ARG(int64_t, d_model);
  /// Number of index heads (H_I in DeepSeek-V3.2's report).
  TORCH_ARG(int64_t, index_n_heads) = 4;
  /// Size of each index head's queries and of the keys they share.
  TORCH_ARG(int64_t, index_head_dim) = 64;
};

/// The lightning indexer of DeepSeek-V3.2 as in the bonus material of Raschka's book (chapter 4,
/// `09_dsa`, `LightningIndexer`). For query token t and key token s:
///
///     I[t, s] = sum_j w[t, j] ReLU(q[t, j] · k[s] / sqrt(index_head_dim))
///
/// with q[t, j] = `W_q_index` x_t (head j), k[s] = `W_k_index` x_s (one key shared by the heads)
/// and w[t] = softmax over the heads of `W_weights` x_t. Each query keeps the top k keys among
/// itself and the tokens before it. Parameters `W_q_index` (d_model -> index_n_heads x
/// index_head_dim), `W_k_index` (d_model -> index_head_dim), `W_weights` (d_model ->
/// index_n_heads), no biases, created in that order.
///
/// Selection is deterministic: the k highest scores, the earlier token first among equal ones
/// (ReLU makes ties at 0 common; torch.topk leaves their order unspecified).
///
/// Thread safety: keys(), scores() and forward() keep nothing in the module (forward()'s score
/// buffers belong to the call), so one instance may serve several threads at once; eval(), to(),
/// reset() and load_weights() need it to themselves.
///
/// Example:
/// \code
/// attention::LightningIndexer indexer(attention::LightningIndexerOptions(64).index_head_dim(16));
/// torch::Tensor x = torch::randn({2, 10, 64});
/// torch::Tensor keys = indexer->keys(x);                // (2, 10, 16): what a cache keeps
/// torch::Tensor chosen = indexer(x, keys, /*topk=*/4);  // (2, 10, 4), -1 where fewer exist
/// \endcode
class ATTENTION_API LightningIndexerImpl : public torch::nn::Cloneable<LightningIndexerImpl> {
 public:
  /// Builds the indexer from options.
  explicit LightningIndexerImpl(const LightningIndexerOptions& options_);
  /// (Re)creates the parameters, initialized as LibTorch's Linear.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// The index keys of tokens x, (B, S, d_model) -> (B, S, index_head_dim).
  torch::Tensor keys(const torch::Tensor& x);

  /// The index scores of queries x (B, T, d_model) over `index_keys` (B, S, index_head_dim) of
  /// S >= T tokens whose last T are x's: (B, T, S), -inf for keys after the query. Whole T x S
  /// scores: for inspection and tests; forward() makes them a block of queries at a time.
  torch::Tensor scores(const torch::Tensor& x, const torch::Tensor& index_keys);

  /// The selected keys of each query: (B, T, min(topk, S)) Long positions in index_keys,
  /// ascending, -1 where the query has fewer keys (itself and those before it). Throws
  /// c10::ValueError for topk < 1 and for shapes as scores() does.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& index_keys, int64_t topk);

  /// The options the indexer was built with.
  LightningIndexerOptions options;
  /// Index queries, d_model -> index_n_heads x index_head_dim.
  torch::nn::Linear W_q_index{nullptr};
  /// Index keys, d_model -> index_head_dim.
  torch::nn::Linear W_k_index{nullptr};
  /// Head weights, d_model -> index_n_heads.
  torch::nn::Linear W_weights{nullptr};

 private:
  /// Scores of queries [t0, t1) against the keys they may see, (B, t1 - t0, offset + t1), from
  /// the index queries (B, T, heads, index_head_dim) and head weights (B, T, heads).
  /// Keys after each query are not masked. With `buffers` (two CPU tensors of the call), the
  /// scores are made in them.
  torch::Tensor block_scores(const torch::Tensor& queries, const torch::Tensor& weights,
                             const torch::Tensor& index_keys, int64_t offset, int64_t t0,
                             int64_t t1, torch::Tensor* buffers);
  /// Checks x and index_keys; returns the offset of x's first token among the keys.
  int64_t check_inputs(const torch::Tensor& x, const torch::Tensor& index_keys) const;
};

TORCH_MODULE(LightningIndexer);

}  // namespace attention
