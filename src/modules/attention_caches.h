#pragma once

// What a MultiHeadAttention forward attends to beside its own keys and values: a KVCache or a
// SlidingKVCache it appends to, or the SharedKV an earlier layer left. One object answers where
// the call's tokens sit, how many keys it attends to, and appends, so that the forward has no
// case per cache; a forward refused after the append puts the cache back as it was.

#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>
#include <attention/sliding_kv_cache.h>

#include <torch/types.h>

#include <c10/util/Optional.h>

#include <utility>

namespace attention {
namespace detail {

class AttentionCaches {
 public:
  /// The caches of `options`, of which the caller has checked that at most one is given.
  explicit AttentionCaches(const MultiHeadAttentionForwardOptions& options);
  AttentionCaches(const AttentionCaches&) = delete;
  AttentionCaches& operator=(const AttentionCaches&) = delete;
  /// Puts an appended cache back as it was, unless keep() was called.
  ~AttentionCaches();

  /// The position of the first of `tokens` new tokens: the tokens cached before them, or the
  /// shared keys before the call's own (which end the shared ones).
  int64_t past(int64_t tokens) const;
  /// How many keys a call with `tokens` new tokens attends to.
  int64_t keys(int64_t tokens) const;
  /// Whether the keys are an earlier layer's (SharedKV): the call projects none of its own.
  bool shared() const { return shared_ != nullptr; }
  /// The KVCache appended to, if one is.
  KVCache* kv_cache() const { return cache_; }

  /// The keys and values to attend to, (B, Hkv, keys(T), head_dim): the cache's after `keys` and
  /// `values` (B, Hkv, T, head_dim) are appended, the shared ones, or the call's own. With
  /// `codes_in_place` an 8-bit KVCache is written and nothing returned: its codes are read.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& keys,
                                                 const torch::Tensor& values, bool codes_in_place);
  /// The forward succeeded: the appends stay.
  void keep() { kept_ = true; }

 private:
  KVCache* cache_;
  SlidingKVCache* sliding_;
  const SharedKV* shared_;
  // The caches as they were: a copy shares the storage, so a KVCache's later positions may be
  // written, but its length (and, if it had none, its storage) comes back, and a SlidingKVCache's
  // append makes new tensors.
  c10::optional<KVCache> saved_cache_;
  c10::optional<SlidingKVCache> saved_sliding_;
  bool kept_ = false;
};

}  // namespace detail
}  // namespace attention
