#include <attention/kv_cache.h>

#include "detail.h"

namespace attention {

namespace {
constexpr const char* kName = "attention::KVCache";
}

KVCache::KVCache(int64_t max_length) : max_length_(max_length) {
  detail::check_positive(max_length, "max_length", kName);
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& keys,
                                                        const torch::Tensor& values) {
  using detail::shape_str;
  TORCH_CHECK_VALUE(
      keys.defined() && values.defined() && keys.dim() == 4 && values.sizes() == keys.sizes(),
      kName, ": expected keys and values of one shape (B, Hkv, T, head_dim), got ",
      keys.defined() ? shape_str(keys.sizes()) : "undefined", " and ",
      values.defined() ? shape_str(values.sizes()) : "undefined");
  TORCH_CHECK_TYPE(
      c10::isFloatingType(keys.scalar_type()) && values.scalar_type() == keys.scalar_type(), kName,
      ": expected floating keys and values of one dtype, got ", keys.scalar_type(), " and ",
      values.scalar_type());
  TORCH_CHECK(values.device() == keys.device(), kName,
              ": expected keys and values on one device, got ", keys.device(), " and ",
              values.device());
  if (keys_.defined()) {
    TORCH_CHECK_VALUE(keys.size(0) == keys_.size(0) && keys.size(1) == keys_.size(1) &&
                          keys.size(3) == keys_.size(3),
                      kName, ": expected keys (", keys_.size(0), ", ", keys_.size(1), ", T, ",
                      keys_.size(3), ") like the cached ones, got ", shape_str(keys.sizes()));
    TORCH_CHECK_TYPE(keys.scalar_type() == keys_.scalar_type(), kName,
                     ": expected keys and values of dtype ", keys_.scalar_type(), ", got ",
                     keys.scalar_type(), " and ", values.scalar_type());
    TORCH_CHECK(keys.device() == keys_.device(), kName, ": expected keys and values on ",
                keys_.device(), ", got ", keys.device(), " and ", values.device());
  }
  const int64_t t_new = keys.size(2);
  TORCH_CHECK_VALUE(length_ + t_new <= max_length_, kName, ": cannot append ", t_new,
                    " token(s) to the ", length_, " cached: max_length is ", max_length_,
                    " (reset() the cache or make a longer one)");
  // Everything is checked: only now is the storage made (on the first append), so that a
  // refused call leaves the cache as it was.
  if (!keys_.defined()) {
    auto sizes = keys.sizes().vec();
    sizes[2] = max_length_;
    keys_ = torch::empty(sizes, keys.options());
    values_ = torch::empty(sizes, values.options());
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
  TORCH_CHECK_VALUE(length >= 0 && length <= length_, kName, ": cannot truncate to ", length,
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
