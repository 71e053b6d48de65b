#include <attention/kv_cache.h>

#include "modules/shared.h"

#include <vector>

namespace attention {

namespace {
constexpr const char* kKVCacheName = "attention::KVCache";
}

KVCache::KVCache(int64_t max_length) : max_length_(max_length) {
  detail::check_positive(max_length, "max_length", kKVCacheName);
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& keys,
                                                        const torch::Tensor& values) {
  detail::check_cache_append(keys, values, keys_, kKVCacheName);
  const int64_t t_new = keys.size(2);
  TORCH_CHECK_VALUE(length_ + t_new <= max_length_, kKVCacheName, ": cannot append ", t_new,
                    " token(s) to the ", length_, " cached: max_length is ", max_length_,
                    " (reset() the cache or make a longer one)");
  // Everything is checked: only now is the storage made (on the first append), so that a
  // refused call leaves the cache as it was.
  // The storage is checked to be addressable, and both tensors are made before either is kept:
  // a refusal or a failed allocation leaves the cache empty.
  if (!keys_.defined()) {
    std::vector<int64_t> sizes[2];
    for (int part = 0; part < 2; ++part) {
      const auto& given = part == 0 ? keys : values;
      sizes[part] = given.sizes().vec();
      sizes[part][2] = max_length_;
      TORCH_CHECK_VALUE(
          detail::fits_in_bytes(sizes[part], static_cast<int64_t>(given.element_size())),
          kKVCacheName, ": storage for max_length = ", max_length_, " tokens of (", given.size(0),
          ", ", given.size(1), ", T, ", given.size(3), ") would exceed 2^63 - 1 bytes");
    }
    auto new_keys = torch::empty(sizes[0], keys.options());
    auto new_values = torch::empty(sizes[1], values.options());
    keys_ = std::move(new_keys);
    values_ = std::move(new_values);
  }
  // The cache holds values, not history: no gradient flows into earlier steps.
  const int64_t cached = length_;
  keys_.narrow(2, cached, t_new).copy_(keys.detach());
  values_.narrow(2, cached, t_new).copy_(values.detach());
  length_ += t_new;
  if (!detail::records_grad(keys, values)) return {this->keys(), this->values()};
  // Training through the cache: the new keys and values themselves, behind the cached ones, so
  // that the gradient reaches this step's projections.
  return {torch::cat({keys_.narrow(2, 0, cached), keys}, 2),
          torch::cat({values_.narrow(2, 0, cached), values}, 2)};
}

void KVCache::truncate(int64_t length) {
  TORCH_CHECK_VALUE(length >= 0 && length <= length_, kKVCacheName, ": cannot truncate to ", length,
                    " tokens: ", length_, " are cached");
  length_ = length;
}

torch::Tensor KVCache::keys() const {
  return keys_.defined() ? keys_.narrow(2, 0, length_) : torch::Tensor();
}

torch::Tensor KVCache::values() const {
  return values_.defined() ? values_.narrow(2, 0, length_) : torch::Tensor();
}

}  // namespace attention
