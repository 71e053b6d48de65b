#pragma once

/// \file
/// A sequence split across the ranks of a Group, for ring attention, and put back together.

#include <attention/distributed/group.h>
#include <attention/export.h>

#include <torch/types.h>

namespace attention {
namespace distributed {

/// This rank's shard of `full` along `dim`: with `balanced`, the sequence is cut into 2W chunks
/// and rank r takes chunks r and 2W-1-r (every rank then has the same share of causal attention's
/// work); without, rank r takes chunk r of W. The length must divide evenly (c10::ValueError
/// otherwise; pad_to_split() pads a sequence that does not).
ATTENTION_DISTRIBUTED_API torch::Tensor shard_sequence(const torch::Tensor& full, int64_t dim,
                                                       const Group& group, bool balanced);

/// The inverse of shard_sequence(): every rank's shard gathered and put back in order, on every
/// rank. Every rank must pass a shard of the same shape and dtype, split the same way; a shard
/// one rank refuses (a `dim` it does not have, an odd balanced length) makes every rank throw its
/// error at once. Differentiable in `local`: the gradient of the whole sequence reaches each
/// rank's shard as that rank's positions of it, which is the gradient of a loss that every rank
/// computes alike on the whole sequence (a sum of different losses per rank would need their
/// gradients summed over the ranks first). Thread safety: a collective, as ring_attention().
///
/// Example:
/// \code
/// auto group = attention::distributed::Group::from_env();
/// auto local = attention::distributed::shard_sequence(torch::randn({1, 4, 64, 16}), 2, group,
///                                                     /*balanced=*/true)
///                  .requires_grad_();
/// auto whole = attention::distributed::gather_sequence(local, 2, group, /*balanced=*/true);
/// whole.pow(2).sum().backward();  // local.grad() is 2 * local
/// \endcode
ATTENTION_DISTRIBUTED_API torch::Tensor gather_sequence(const torch::Tensor& local, int64_t dim,
                                                        const Group& group, bool balanced);

/// A sequence padded at its end to a length that a split divides: `padded` holds the original
/// positions and zeros after them, `padding` (T_padded,) bool is true at the added positions,
/// `length` is the original length.
struct PaddedSequence {
  /// The original positions along `dim`, then zeros up to a length the split divides.
  torch::Tensor padded;
  /// (T_padded,) bool: true at the positions that were added.
  torch::Tensor padding;
  /// The original length along `dim`.
  int64_t length = 0;
};

/// `full` with zeros appended along `dim` up to the next multiple of W (2W with `balanced`), so
/// that shard_sequence() takes it; no copy when the length already divides. For ring attention
/// over a sequence of any length: pad the queries, keys and values alike, hide the added keys with
/// key_padding_mask (causal attention hides them anyway: they come after every real query, but
/// a non-causal call would see them), and cut the gathered output back to `length`. Local: no
/// communication. c10::ValueError for an undefined or rank-0 tensor and a `dim` it does not have.
///
/// Example:
/// \code
/// namespace dist = attention::distributed;
/// auto group = dist::Group::from_env();
/// torch::Tensor x = torch::randn({1, 4, 1000, 64});  // (B, H, T, d), T not a multiple of 2W
/// auto p = dist::pad_to_split(x, 2, group, /*balanced=*/false);
/// auto local = dist::shard_sequence(p.padded, 2, group, false);
/// auto mask = dist::shard_sequence(p.padding.expand({1, p.padding.size(0)}), 1, group, false);
/// auto out = dist::ring_attention(local, local, local, group,
///                                 dist::RingAttentionOptions().key_padding_mask(mask));
/// auto whole = dist::gather_sequence(out, 2, group, false).narrow(2, 0, p.length);
/// \endcode
ATTENTION_DISTRIBUTED_API PaddedSequence pad_to_split(const torch::Tensor& full, int64_t dim,
                                                      const Group& group, bool balanced);

}  // namespace distributed
}  // namespace attention
