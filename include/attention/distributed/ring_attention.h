#pragma once

/// \file
/// Ring attention: scaled dot-product attention over a sequence split across the ranks of a
/// Group; key/value blocks travel around the ring while each rank works on the block at hand.

#include <attention/distributed/group.h>
#include <attention/distributed/sequence_split.h>
#include <attention/export.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

namespace attention {
namespace distributed {

/// Options of ring_attention().
struct RingAttentionOptions {
  /// Hide later keys from each query. Which keys are later depends on where each rank's positions
  /// lie in the sequence, so a causal call must also say how the shards were made (`balanced`).
  TORCH_ARG(bool, is_causal) = false;
  /// How the shards were made: shard_sequence()'s `balanced`. Required when is_causal (a causal
  /// call without it is refused: the function cannot tell from the tensors); ignored otherwise,
  /// since without causality every split gives the same rows. Both splits give exact results:
  /// balanced (each rank an early and a late chunk, an even local length) gives every rank the
  /// same work, contiguous leaves rank r with r + 1 blocks of it, so the last rank sets the pace.
  TORCH_ARG(c10::optional<bool>, balanced) = c10::nullopt;
  /// Multiplies the scores; when unset they are divided by sqrt(d).
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
  /// Bool (B, T_local), true = padding: this rank's keys that no query may see. It travels with
  /// its keys around the ring.
  TORCH_ARG(torch::Tensor, key_padding_mask) = {};
  /// Query and key block size of the Chunked kernel each rank runs.
  TORCH_ARG(int64_t, block_size) = 256;
};

/// softmax(Q Kᵀ · scale) V over the whole sequence, where each rank holds one shard of it (see
/// shard_sequence()): `query` (B, H, T_local, d), `key` (B, Hkv, T_local, d) and `value` (B, Hkv,
/// T_local, dv) of this rank's positions, with H a multiple of Hkv (grouped-query attention).
/// Returns this rank's output (B, H, T_local, dv), equal to the matching rows of
/// functional::scaled_dot_product_attention on the gathered inputs.
///
/// The keys and values go once around the ring (W - 1 transfers of T_local positions per rank,
/// each overlapped with the kernel's work on the previous block); per rank the memory is that of
/// the local shard plus two blocks. Differentiable: the backward sends the keys and values around
/// once more, together with their gradients, which arrive back at their rank at the end.
/// Float and double CPU tensors; every rank must pass the same shapes and options (checked,
/// with one small collective). A rank that stops makes the others fail within the group's timeout.
///
/// Thread safety: a collective, forward and backward alike: on each rank no other collective of
/// `group` may run meanwhile (including a backward on another thread).
///
/// Example:
/// \code
/// namespace dist = attention::distributed;
/// auto group = dist::Group::from_env();
/// torch::manual_seed(0);  // the same inputs on every rank, (B, H, T, d)
/// torch::Tensor q_full = torch::randn({1, 8, 4096, 64});
/// torch::Tensor k_full = torch::randn({1, 8, 4096, 64}), v_full = torch::randn({1, 8, 4096, 64});
/// auto q = dist::shard_sequence(q_full, 2, group, /*balanced=*/true);
/// auto k = dist::shard_sequence(k_full, 2, group, /*balanced=*/true);
/// auto v = dist::shard_sequence(v_full, 2, group, /*balanced=*/true);
/// auto out = dist::ring_attention(q, k, v, group,
///                                 dist::RingAttentionOptions().is_causal(true).balanced(true));
/// auto out_full = dist::gather_sequence(out, 2, group, /*balanced=*/true);
/// \endcode
ATTENTION_DISTRIBUTED_API torch::Tensor ring_attention(const torch::Tensor& query,
                                                       const torch::Tensor& key,
                                                       const torch::Tensor& value,
                                                       const Group& group,
                                                       const RingAttentionOptions& options = {});

}  // namespace distributed
}  // namespace attention
