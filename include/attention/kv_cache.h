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

  /// Appends keys and values (B, Hkv, T_new, head_dim) and returns everything cached,
  /// (B, Hkv, length(), head_dim): views of the storage, or, when autograd records the new
  /// tokens, a copy whose last T_new positions carry their gradient (see the class). Throws
  /// c10::ValueError when the tokens would not fit, or when the shape, dtype or device differs from
  /// the earlier appends.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& keys,
                                                 const torch::Tensor& values);

  /// Forgets every cached token; the storage is kept for reuse.
  void reset() { length_ = 0; }

  /// Keeps the first `length` tokens and forgets the rest (to roll back rejected tokens, say).
  /// Throws c10::ValueError unless 0 <= length <= length().
  void truncate(int64_t length);

  /// Number of tokens cached.
  int64_t length() const { return length_; }
  /// Most tokens the cache holds.
  int64_t max_length() const { return max_length_; }

  /// Cached keys, (B, Hkv, length(), head_dim); undefined before the first append.
  torch::Tensor keys() const;
  /// Cached values, (B, Hkv, length(), head_dim); undefined before the first append.
  torch::Tensor values() const;

 private:
  int64_t max_length_;
  int64_t length_ = 0;
  torch::Tensor keys_;
  torch::Tensor values_;
};

}  // namespace attention
