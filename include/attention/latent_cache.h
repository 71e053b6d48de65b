#pragma once

/// \file
/// The cache of multi-head latent attention: one latent vector per token instead of keys and
/// values per head.

#include <attention/export.h>
#include <torch/types.h>

namespace attention {

/// The latent vectors of the tokens seen so far (MultiHeadLatentAttention's `W_DKV` of each
/// token), in storage preallocated to a maximum length.
///
/// The storage, (B, max_length, latent_dim), is allocated on the first append with that append's
/// batch size, latent size, dtype and device; every later append must match them. A token costs
/// latent_dim elements for all heads together, where a KVCache holds 2 x num_kv_heads x head_dim.
///
/// Sharing and gradients as KVCache: append() returns a view of the storage in inference (valid
/// after the cache is gone, overwritten after truncate() or reset()), and, when autograd records
/// the new latent, the cached tokens followed by the new latent itself, so that the gradient
/// reaches this step's projection.
///
/// Thread safety: none inside. One thread at a time (const calls included); views handed out as
/// KVCache's are.
///
/// Example:
/// \code
/// attention::LatentCache cache(/*max_length=*/1024);
/// torch::Tensor latent = cache.append(torch::randn({2, 5, 16}));  // (2, 5, 16)
/// latent = cache.append(torch::randn({2, 1, 16}));                // (2, 6, 16)
/// cache.truncate(5);                                              // forget the last token
/// \endcode
class ATTENTION_API LatentCache {
 public:
  /// An empty cache for up to `max_length` tokens; throws c10::ValueError unless positive.
  explicit LatentCache(int64_t max_length);

  /// Appends the latent of new tokens, (B, T_new, latent_dim) floating, and returns every cached
  /// token's, (B, length(), latent_dim). Throws c10::ValueError when the tokens would not fit or
  /// the shape differs from the earlier appends, c10::TypeError for another dtype, c10::Error for
  /// another device; a refused append leaves the cache as it was.
  torch::Tensor append(const torch::Tensor& latent);

  /// Forgets every cached token; the storage is kept for reuse.
  void reset() { length_ = 0; }
  /// Keeps the first `length` tokens and forgets the rest. Throws c10::ValueError unless
  /// 0 <= length <= length().
  void truncate(int64_t length);

  /// Number of tokens cached.
  int64_t length() const { return length_; }
  /// Most tokens the cache holds.
  int64_t max_length() const { return max_length_; }
  /// The cached latent, (B, length(), latent_dim); undefined before the first append.
  torch::Tensor latent() const;
  /// Bytes of one token of one batch row: latent_dim x the element size; 0 before the first
  /// append.
  int64_t bytes_per_token() const;

 private:
  int64_t max_length_;
  int64_t length_ = 0;
  torch::Tensor storage_;
};

}  // namespace attention
