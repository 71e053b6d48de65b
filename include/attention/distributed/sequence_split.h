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
/// rank. Differentiable for none of its inputs (it is for checks and outputs).
ATTENTION_DISTRIBUTED_API torch::Tensor gather_sequence(const torch::Tensor& local, int64_t dim,
                                                        const Group& group, bool balanced);

}  // namespace distributed
}  // namespace attention
