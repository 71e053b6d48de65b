#pragma once

/// \file
/// A key/value cache for incremental decoding.

#include <attention/export.h>
#include <torch/types.h>

#include <utility>

namespace attention {

/// Keys and values of the tokens seen so far, in storage preallocated to a maximum length.
///
/// The storage, (B, Hkv, max_length, head_dim) for keys and for values, is allocated on the first
/// append, with that append's batch size, heads, head size, dtype and device; every later append
/// must match them. reset() empties the cache and keeps the storage.
///
/// Sharing: keys(), values() and what append() returns in inference are views of that storage.
/// They stay valid (the storage lives as long as any view of it, even past the cache), but they
/// are not snapshots: after truncate(n) or reset(), the next append writes over positions n (or
/// 0) on, and every view handed out earlier shows the new tokens there. clone() a view to keep
/// it.
///
/// Gradients: the cache stores detached copies, so no gradient flows into earlier steps. When
/// autograd records the appended keys or values (grad mode on and one of them requires a
/// gradient), append() returns the cached tokens followed by the new keys and values themselves
/// (a copy, not a view), so the gradient reaches this step's keys and values.
///
/// 8 bits: KVCache(max_length, torch::kChar) keeps each token's row of each head as int8 codes
/// and a float scale (max|x| / 127), a quarter of float's bytes (PagedKVCache's format; see
/// docs/SERVING.md). append() then returns what the codes stand for (a copy in the appended
/// dtype); MultiHeadAttention reads the codes in place instead (write(), keys(), key_scales()).
///
/// Thread safety: none inside. One thread at a time (const calls included); hand a cache over
/// through a mutex or a queue. Views handed out may be read on other threads until truncate() or
/// reset() and a later append write over them.
///
/// Example:
/// \code
/// attention::KVCache cache(/*max_length=*/1024);
/// torch::Tensor k = torch::randn({1, 8, 1, 64}), v = torch::randn({1, 8, 1, 64});
/// auto [keys, values] = cache.append(k, v);  // every key and value so far: (1, 8, 1, 64)
/// cache.truncate(0);                          // start over, keeping the memory
/// \endcode
class ATTENTION_API KVCache {
 public:
  /// An empty cache for up to `max_length` tokens; throws c10::ValueError unless positive.
  explicit KVCache(int64_t max_length);
  /// An empty cache that keeps its tokens in `storage`: torch::kChar, 8-bit codes and a float
  /// scale per token and head (the only storage other than the appended dtype). Throws
  /// c10::ValueError unless max_length is positive, c10::TypeError for another storage.
  KVCache(int64_t max_length, torch::Dtype storage);

  /// Appends keys and values (B, Hkv, T_new, head_dim) and returns everything cached,
  /// (B, Hkv, length(), head_dim): views of the storage, or, when autograd records the new
  /// tokens, a copy whose last T_new positions carry their gradient (see the class). Throws
  /// c10::ValueError when the tokens would not fit, or when the shape, dtype or device differs from
  /// the earlier appends.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& keys,
                                                 const torch::Tensor& values);
  /// Appends as append() does and returns nothing: for readers of keys() and values() in place
  /// (an 8-bit cache's codes with key_scales() and value_scales()). The same checks; nothing is
  /// written when one fails.
  void write(const torch::Tensor& keys, const torch::Tensor& values);

  /// Forgets every cached token; the storage is kept for reuse.
  void reset() { length_ = 0; }

  /// Keeps the first `length` tokens and forgets the rest (to roll back rejected tokens, say).
  /// Throws c10::ValueError unless 0 <= length <= length().
  void truncate(int64_t length);

  /// Number of tokens cached.
  int64_t length() const { return length_; }
  /// Most tokens the cache holds.
  int64_t max_length() const { return max_length_; }

  /// Cached keys, (B, Hkv, length(), head_dim); undefined before the first append. An 8-bit
  /// cache's are its int8 codes.
  torch::Tensor keys() const;
  /// Cached values, (B, Hkv, length(), head_dim); undefined before the first append.
  torch::Tensor values() const;
  /// An 8-bit cache's scales of the cached keys, (B, Hkv, length()) float: key [b, h, t, :]
  /// stands for keys()[b, h, t, :] times it. Undefined before the first append and for other
  /// caches.
  torch::Tensor key_scales() const;
  /// An 8-bit cache's scales of the cached values, as key_scales().
  torch::Tensor value_scales() const;
  /// Whether the cache keeps 8-bit codes and scales.
  bool quantized() const { return quantized_; }

 private:
  int64_t max_length_;
  int64_t length_ = 0;
  bool quantized_ = false;
  torch::Tensor keys_;
  torch::Tensor values_;
  // 8-bit caches: the scales, (B, Hkv, max_length) float, and an empty tensor of the appended
  // shape, dtype and device that later appends are checked against.
  torch::Tensor key_scales_, value_scales_, appended_;
};

}  // namespace attention
