#pragma once

/// \file
/// Multi-head attention split by heads across the ranks of a Group (tensor parallelism, as
/// Megatron-LM splits it).

#include <attention/distributed/group.h>
#include <attention/export.h>
#include <attention/multi_head_attention.h>
#include <attention/weights.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>
#include <string>

namespace attention {
namespace distributed {

/// This rank's share of a MultiHeadAttention: num_heads / W query heads and num_kv_heads / W
/// key/value heads (W = group.size(), which must divide both). `W_query`, `W_key` and `W_value`
/// hold the output rows of those heads and `out_proj.weight` their input columns; `out_proj.bias`
/// is whole on every rank. So the parameter names are the full module's, with sliced shapes.
///
/// Forward: each rank attends with its heads and projects its share of the output; one sum over
/// the ranks (an all-reduce) gives the full output on every rank. Backward has one all-reduce
/// as well, for the gradient of the input. The input x must be the same on every rank. Options
/// and results as MultiHeadAttention's, except `need_weights` (refused). A KVCache passed in
/// holds this rank's key/value heads.
///
/// Thread safety: forward() and gather() are collectives on `group`: one at a time on a rank,
/// never overlapping another collective of the group there (docs/THREADS.md).
///
/// Example:
/// \code
/// auto group = attention::distributed::Group::from_env();
/// torch::manual_seed(0);  // the same full module and input on every rank
/// attention::MultiHeadAttention full(768, 768, 12);
/// torch::Tensor x = torch::randn({2, 128, 768});
/// auto part = attention::distributed::shard_heads(*full, group);
/// torch::Tensor y = part->forward(x).output;  // == full->forward(x).output
/// attention::MultiHeadAttention again = part->gather();
/// \endcode
class ATTENTION_DISTRIBUTED_API HeadParallelMultiHeadAttentionImpl
    : public torch::nn::Cloneable<HeadParallelMultiHeadAttentionImpl>,
      public DerivedBuffers {
 public:
  /// This rank's share of a module with the (full) `options`: its projections initialized as
  /// LibTorch initializes Linear layers of their (sliced) shapes from this rank's generator, and
  /// `out_proj.bias` zero, so that it is the same on every rank. For the weights of a given full
  /// module use shard_heads() or load_sharded(). Collective: checks that every rank passes the
  /// same options.
  HeadParallelMultiHeadAttentionImpl(const MultiHeadAttentionOptions& options, Group group);

  /// (Re)creates this rank's parameters.
  void reset() override;
  /// Prints the module's name, the full options and this rank's heads.
  void pretty_print(std::ostream& stream) const override;
  /// The full module's output on every rank; see the class. Collective.
  functional::AttentionOutput forward(const torch::Tensor& x,
                                      const MultiHeadAttentionForwardOptions& options = {});
  /// The full module, gathered from every rank's share, on every rank. Collective.
  MultiHeadAttention gather() const;
  /// `mask`: the book's causal-mask buffer, which the module derives.
  std::vector<std::string> derived_buffer_names() const override { return {"mask"}; }

  /// The options of the full module.
  MultiHeadAttentionOptions options;
  /// The group the heads are split over.
  Group group;
  /// This rank's heads without the output projection: their queries, keys, values and attention.
  MultiHeadAttention heads{nullptr};
  /// Query projection of this rank's heads, d_in -> num_heads / W x head_dim.
  torch::nn::Linear W_query{nullptr};
  /// Key projection of this rank's key/value heads.
  torch::nn::Linear W_key{nullptr};
  /// Value projection of this rank's key/value heads.
  torch::nn::Linear W_value{nullptr};
  /// Output projection from this rank's heads to all d_out features (bias whole, added once).
  torch::nn::Linear out_proj{nullptr};
};

TORCH_MODULE(HeadParallelMultiHeadAttention);

/// This rank's share of `full`'s heads and weights (copied). Collective; every rank must pass the
/// same module (e.g. made with the same seed or loaded from the same file).
ATTENTION_DISTRIBUTED_API HeadParallelMultiHeadAttention
shard_heads(const MultiHeadAttentionImpl& full, const Group& group);

/// Loads a full module's weight file (any format load_weights() reads, with its options) and
/// keeps this rank's share. Collective.
ATTENTION_DISTRIBUTED_API HeadParallelMultiHeadAttention
load_sharded(const std::string& path, const MultiHeadAttentionOptions& options, const Group& group,
             const LoadOptions& load_options = {});

}  // namespace distributed
}  // namespace attention
