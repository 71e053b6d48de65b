#pragma once

/// \file
/// A key/value cache whose memory is bounded by a window: for sliding-window attention, and for
/// StreamingLLM's attention sinks.

#include <attention/export.h>
#include <torch/types.h>

#include <utility>

namespace attention {

/// Keys and values of the last `window - 1` tokens (what a query with a sliding window of
/// `window` keys, itself included, still needs) and, when `sink_tokens` > 0, of the first
/// `sink_tokens` tokens for good (StreamingLLM's attention sinks, Xiao et al. 2023). Older tokens
/// are dropped, so memory stays at (sink_tokens + window - 1) tokens however long the sequence.
///
/// With MultiHeadAttention (MultiHeadAttentionForwardOptions::sliding_kv_cache):
/// - a module with `sliding_window(W)` and a cache of `window` >= W (no sink tokens) gives, token
///   by token or in chunks, exactly what one forward over the whole sequence gives;
/// - a module without a window and a cache with sink tokens is StreamingLLM: each query sees the
///   sink tokens, the window - 1 tokens before its call, and its call's tokens up to itself.
/// Rotary embeddings use each token's position in the whole sequence (position()).
///
/// append() returns (B, Hkv, held + T_new, head_dim): the tokens held, then the new ones; a new
/// tensor each call (a copy; the new tokens keep their gradient when autograd records them, and
/// no gradient flows into earlier steps).
///
/// Thread safety: none inside. One thread at a time (const calls included); what append()
/// returned is a tensor of its own and may be read anywhere.
///
/// Example:
/// \code
/// attention::SlidingKVCache cache(/*window=*/4096, /*sink_tokens=*/4);
/// torch::Tensor k = torch::randn({1, 8, 1, 64}), v = torch::randn({1, 8, 1, 64});
/// auto [keys, values] = cache.append(k, v);  // (1, 8, 1, 64): nothing held before
/// int64_t next = cache.position();            // 1
/// \endcode
class ATTENTION_API SlidingKVCache {
 public:
  /// Holds the last `window - 1` tokens and the first `sink_tokens`; throws c10::ValueError
  /// unless window >= 1 and sink_tokens >= 0.
  explicit SlidingKVCache(int64_t window, int64_t sink_tokens = 0);

  /// Appends keys and values (B, Hkv, T_new, head_dim) and returns the tokens held before the
  /// call followed by the new ones. Throws c10::ValueError (c10::TypeError for dtypes,
  /// c10::Error for devices) when they differ from the earlier appends.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& keys,
                                                 const torch::Tensor& values);

  /// Forgets every token (and frees the memory).
  void reset();

  /// Tokens appended since construction or reset(): the next token's position.
  int64_t position() const { return position_; }
  /// Tokens held now: at most sink_tokens + window - 1.
  int64_t length() const;
  /// The window it was made for.
  int64_t window() const { return window_; }
  /// The leading tokens it keeps for good.
  int64_t sink_tokens() const { return sink_tokens_; }

 private:
  int64_t window_, sink_tokens_;
  int64_t position_ = 0;
  // The first tokens (up to sink_tokens) and the most recent ones after them (up to window - 1),
  // detached; undefined before the first append.
  torch::Tensor head_keys_, head_values_, tail_keys_, tail_values_;
};

}  // namespace attention
