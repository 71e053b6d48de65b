#include <attention/sliding_kv_cache.h>

#include "modules/shared.h"

#include <torch/torch.h>

namespace attention {

namespace {
constexpr const char* kSlidingKVCacheName = "attention::SlidingKVCache";
}

SlidingKVCache::SlidingKVCache(int64_t window, int64_t sink_tokens)
    : window_(window), sink_tokens_(sink_tokens) {
  detail::check_positive(window, "window", kSlidingKVCacheName);
  TORCH_CHECK_VALUE(sink_tokens >= 0, kSlidingKVCacheName, ": expected sink_tokens >= 0, got ",
                    sink_tokens);
}

int64_t SlidingKVCache::length() const {
  return head_keys_.defined() ? head_keys_.size(2) + tail_keys_.size(2) : 0;
}

void SlidingKVCache::reset() {
  position_ = 0;
  head_keys_ = head_values_ = tail_keys_ = tail_values_ = torch::Tensor();
}

std::pair<torch::Tensor, torch::Tensor> SlidingKVCache::append(const torch::Tensor& keys,
                                                               const torch::Tensor& values) {
  detail::check_cache_append(keys, values, head_keys_, kSlidingKVCacheName);
  // The first call's parts start empty, in its shape: tensors of their own, where views of the
  // call's keys would hold all of their memory for as long as the parts live.
  const auto empty_part = [](const torch::Tensor& like) {
    auto sizes = like.sizes().vec();
    sizes[2] = 0;
    return torch::empty(sizes, like.options());
  };
  const bool first = !head_keys_.defined();
  const auto head_keys = first ? empty_part(keys) : head_keys_;
  const auto tail_keys = first ? empty_part(keys) : tail_keys_;
  const auto head_values = first ? empty_part(values) : head_values_;
  const auto tail_values = first ? empty_part(values) : tail_values_;
  // Everything is made before any part is kept: a failure (of memory, say) leaves the cache as it
  // was, a first call's shape not fixed.
  auto held_keys = torch::cat({head_keys, tail_keys, keys}, 2);
  auto held_values = torch::cat({head_values, tail_values, values}, 2);
  // The new tokens first fill the sink tokens (only while fewer than sink_tokens were seen, when
  // nothing was dropped yet), then join the tail, which keeps its last window - 1.
  const int64_t t_new = keys.size(2);
  const int64_t to_head = std::min(t_new, sink_tokens_ - head_keys.size(2));
  const auto keep = [&](const torch::Tensor& head, const torch::Tensor& tail,
                        const torch::Tensor& fresh) {
    auto detached = fresh.detach();
    auto new_head = to_head > 0 ? torch::cat({head, detached.narrow(2, 0, to_head)}, 2) : head;
    auto rest = torch::cat({tail, detached.narrow(2, to_head, t_new - to_head)}, 2);
    const int64_t kept = std::min(rest.size(2), window_ - 1);
    return std::make_pair(new_head, rest.narrow(2, rest.size(2) - kept, kept).clone());
  };
  auto kept_keys = keep(head_keys, tail_keys, keys);
  auto kept_values = keep(head_values, tail_values, values);
  std::tie(head_keys_, tail_keys_) = std::move(kept_keys);
  std::tie(head_values_, tail_values_) = std::move(kept_values);
  position_ += t_new;
  return {held_keys, held_values};
}

}  // namespace attention
