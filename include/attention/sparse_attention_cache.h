#pragma once

/// \file
/// The cache of DeepSeek sparse attention: each token's keys and values, and its lightning index
/// key.

#include <attention/export.h>
#include <attention/kv_cache.h>
#include <attention/latent_cache.h>

#include <torch/types.h>

namespace attention {

/// Keys and values (B, H, T, head_dim), as a KVCache keeps them, and beside them each token's
/// index key (B, T, index_head_dim), which DeepSeekSparseAttention's indexer scores every step.
/// Appends to both or to neither: a refused append leaves the cache as it was.
///
/// Thread safety: none inside. One thread at a time (const calls included).
///
/// Example:
/// \code
/// attention::SparseAttentionCache cache(/*max_length=*/1024);
/// auto all = cache.append(torch::randn({1, 4, 5, 16}), torch::randn({1, 4, 5, 16}),
///                         torch::randn({1, 5, 8}));
/// // all.keys (1, 4, 5, 16), all.values (1, 4, 5, 16), all.index_keys (1, 5, 8)
/// \endcode
class ATTENTION_API SparseAttentionCache {
 public:
  /// An empty cache for up to `max_length` tokens; throws c10::ValueError unless positive.
  explicit SparseAttentionCache(int64_t max_length);

  /// What append() returns: every cached token's keys, values and index keys.
  struct Cached {
    /// Keys, (B, H, length(), head_dim).
    torch::Tensor keys;
    /// Values, (B, H, length(), head_dim).
    torch::Tensor values;
    /// Index keys, (B, length(), index_head_dim).
    torch::Tensor index_keys;
  };

  /// Appends T_new tokens: keys and values (B, H, T_new, head_dim) as KVCache::append takes
  /// them, index keys (B, T_new, index_head_dim) of their dtype and device. Throws as those
  /// caches do, and c10::ValueError when the index keys' batch or token count differs from the
  /// keys'.
  Cached append(const torch::Tensor& keys, const torch::Tensor& values,
                const torch::Tensor& index_keys);

  /// Forgets every cached token; the storage is kept.
  void reset();
  /// Keeps the first `length` tokens. Throws c10::ValueError unless 0 <= length <= length().
  void truncate(int64_t length);
  /// Number of tokens cached.
  int64_t length() const { return kv_.length(); }
  /// Most tokens the cache holds.
  int64_t max_length() const { return kv_.max_length(); }
  /// Bytes of one token of one batch row: keys, values and index key; 0 before the first append.
  int64_t bytes_per_token() const;

 private:
  KVCache kv_;
  LatentCache index_keys_;
};

}  // namespace attention
