#pragma once

/// \file
/// A sequence split across the ranks of a Group, for ring attention, and put back together.

#include <attention/distributed/group.h>
#include <attention/export.h>

#include <torch/types.h>

namespace attention {
namespace distributed {

/// This rank's shard of `full` along `dim`: with `balanced`, the sequence is cut into 2W chunks
/// and rank r takes chunks r and 2W-1-r (causal attention needs this); without, rank r takes
/// chunk r of W. The length must divide evenly (c10::ValueError otherwise).
ATTENTION_DISTRIBUTED_API torch::Tensor shard_sequence(const torch::Tensor& full, int64_t dim,
                                                       const Group& group, bool balanced);

/// The inverse of shard_sequence(): every rank's shard gathered and put back in order, on every
/// rank. Every rank must pass a shard of the same shape and dtype, split the same way; a shard
/// one rank refuses (a `dim` it does not have, an odd balanced length) makes every rank throw its
/// error at once. Differentiable in `local`: the gradient of the whole sequence reaches each
/// rank's shard as that rank's positions of it, which is the gradient of a loss that every rank
/// computes alike on the whole sequence (a sum of different losses per rank would need their
/// gradients summed over the ranks first).
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

}  // namespace distributed
}  // namespace attention
