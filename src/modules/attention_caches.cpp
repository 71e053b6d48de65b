#include "modules/attention_caches.h"

namespace attention {
namespace detail {

AttentionCaches::AttentionCaches(const MultiHeadAttentionForwardOptions& options)
    : cache_(options.kv_cache()),
      sliding_(options.sliding_kv_cache()),
      shared_(options.shared_kv()) {
  if (cache_) saved_cache_ = *cache_;
  if (sliding_) saved_sliding_ = *sliding_;
}

AttentionCaches::~AttentionCaches() {
  if (kept_) return;
  if (cache_) *cache_ = *saved_cache_;
  if (sliding_) *sliding_ = *saved_sliding_;
}

int64_t AttentionCaches::past(int64_t tokens) const {
  if (cache_) return cache_->length();
  if (sliding_) return sliding_->position();
  if (shared_) return shared_->keys.size(2) - tokens;
  return 0;
}

int64_t AttentionCaches::keys(int64_t tokens) const {
  if (cache_) return cache_->length() + tokens;
  if (sliding_) return sliding_->length() + tokens;
  if (shared_) return shared_->keys.size(2);
  return tokens;
}

std::pair<torch::Tensor, torch::Tensor> AttentionCaches::append(const torch::Tensor& keys,
                                                                const torch::Tensor& values,
                                                                bool codes_in_place) {
  if (shared_) return {shared_->keys, shared_->values};
  if (cache_ && codes_in_place) {
    cache_->write(keys, values);
    return {};
  }
  if (cache_) return cache_->append(keys, values);
  if (sliding_) return sliding_->append(keys, values);
  return {keys, values};
}

}  // namespace detail
}  // namespace attention
