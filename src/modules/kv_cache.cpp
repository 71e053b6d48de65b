#include <attention/kv_cache.h>

#include "memory/int8_rows.h"
#include "modules/shared.h"

#include <torch/torch.h>

#include <vector>

namespace attention {

namespace {
constexpr const char* kKVCacheName = "attention::KVCache";
}

KVCache::KVCache(int64_t max_length) : max_length_(max_length) {
  detail::check_positive(max_length, "max_length", kKVCacheName);
}

KVCache::KVCache(int64_t max_length, torch::Dtype storage) : KVCache(max_length) {
  TORCH_CHECK_TYPE(storage == torch::kChar, kKVCacheName,
                   ": expected storage Char (8-bit codes and scales), got ", storage,
                   " (a cache in the appended dtype takes no storage argument)");
  quantized_ = true;
}

void KVCache::write(const torch::Tensor& keys, const torch::Tensor& values) {
  detail::check_cache_append(keys, values, quantized_ ? appended_ : keys_, kKVCacheName);
  const int64_t t_new = keys.size(2);
  // Written so that no sum can overflow: t_new may be anything up to INT64_MAX.
  TORCH_CHECK_VALUE(t_new <= max_length_ - length_, kKVCacheName, ": cannot append ", t_new,
                    " token(s) to the ", length_, " cached: max_length is ", max_length_,
                    " (reset() the cache or make a longer one)");
  // A row's scale is its largest magnitude: a row of no features has none.
  TORCH_CHECK_VALUE(!quantized_ || keys.size(3) > 0, kKVCacheName,
                    ": an 8-bit cache needs head_dim >= 1, got keys ",
                    detail::shape_str(keys.sizes()));
  // Everything is checked: only now is the storage made (on the first append), so that a
  // refused call leaves the cache as it was.
  // The storage is checked to be addressable, and every tensor is made before any is kept:
  // a refusal or a failed allocation leaves the cache empty.
  const auto element = quantized_ ? int64_t{1} : static_cast<int64_t>(keys.element_size());
  // An 8-bit cache quantizes first: a failure there leaves it as it was too.
  detail::Int8Rows codes[2];
  if (quantized_) codes[0] = detail::quantize_rows(keys), codes[1] = detail::quantize_rows(values);
  if (!keys_.defined()) {
    std::vector<int64_t> sizes = keys.sizes().vec();
    sizes[2] = max_length_;
    // An 8-bit cache's scales, 4 bytes a row, outgrow its codes for head sizes below 4.
    const bool scales_fit = !quantized_ || detail::fits_in_bytes({sizes[0], sizes[1], sizes[2]}, 4);
    TORCH_CHECK_VALUE(detail::fits_in_bytes(sizes, element) && scales_fit, kKVCacheName,
                      ": storage for max_length = ", max_length_, " tokens of (", keys.size(0),
                      ", ", keys.size(1), ", T, ", keys.size(3), ") would exceed 2^63 - 1 bytes");
    const auto options = quantized_ ? keys.options().dtype(torch::kChar) : keys.options();
    auto new_keys = torch::empty(sizes, options);
    auto new_values = torch::empty(sizes, options);
    torch::Tensor new_key_scales, new_value_scales, new_appended;
    if (quantized_) {
      const auto scales = keys.options().dtype(torch::kFloat);
      new_key_scales = torch::empty({sizes[0], sizes[1], sizes[2]}, scales);
      new_value_scales = torch::empty({sizes[0], sizes[1], sizes[2]}, scales);
      new_appended = torch::empty({sizes[0], sizes[1], 0, sizes[3]}, keys.options());
    }
    keys_ = std::move(new_keys);
    values_ = std::move(new_values);
    key_scales_ = std::move(new_key_scales);
    value_scales_ = std::move(new_value_scales);
    appended_ = std::move(new_appended);
  }
  // The cache holds values, not history: no gradient flows into earlier steps.
  if (quantized_) {
    keys_.narrow(2, length_, t_new).copy_(codes[0].codes);
    values_.narrow(2, length_, t_new).copy_(codes[1].codes);
    key_scales_.narrow(2, length_, t_new).copy_(codes[0].scales);
    value_scales_.narrow(2, length_, t_new).copy_(codes[1].scales);
  } else {
    keys_.narrow(2, length_, t_new).copy_(keys.detach());
    values_.narrow(2, length_, t_new).copy_(values.detach());
  }
  length_ += t_new;
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& keys,
                                                        const torch::Tensor& values) {
  const int64_t cached = length_;
  write(keys, values);
  const auto dtype = keys.scalar_type();
  const auto before = [&](const torch::Tensor& all, const torch::Tensor& scales) {
    const auto kept = all.narrow(2, 0, cached);
    return quantized_ ? detail::dequantize_rows(kept, scales.narrow(2, 0, cached), dtype) : kept;
  };
  if (!detail::records_grad(keys, values)) {
    if (!quantized_) return {this->keys(), this->values()};
    return {detail::dequantize_rows(this->keys(), key_scales(), dtype),
            detail::dequantize_rows(this->values(), value_scales(), dtype)};
  }
  // Training through the cache: the new keys and values themselves, behind the cached ones, so
  // that the gradient reaches this step's projections.
  return {torch::cat({before(keys_, key_scales_), keys}, 2),
          torch::cat({before(values_, value_scales_), values}, 2)};
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

torch::Tensor KVCache::key_scales() const {
  return key_scales_.defined() ? key_scales_.narrow(2, 0, length_) : torch::Tensor();
}

torch::Tensor KVCache::value_scales() const {
  return value_scales_.defined() ? value_scales_.narrow(2, 0, length_) : torch::Tensor();
}

}  // namespace attention
